"""Configured webhook sources: a named endpoint with a provider, secrets and limits.

Built from settings.WEBHOOK_SOURCES (+ WEBHOOK_EXTRA_SOURCES JSON) and the environment.
Per-source options (all optional except `provider`):

    provider            stripe | github | slack | standard | hmac
    secrets_env         name of the env var holding the secret(s), comma-separated for rotation
    enabled             false turns the endpoint into a 404 without removing its history
    max_body_bytes      default WEBHOOK_MAX_BODY_BYTES (1 MiB)
    max_header_bytes    total size of the request's header fields, default 32 KiB (431 past it)
    tolerance_seconds   signature timestamp tolerance, default WEBHOOK_TOLERANCE_SECONDS (300)
    timeout_seconds     how long the sender waits for our answer, default its provider's
                        (ingress/providers.py; none known: WEBHOOK_REQUEST_BUDGET_SECONDS): the
                        request's budget, header read included (kernel/budgets.py)
    signature_header    `hmac` only: the header carrying the signature (named providers use theirs,
                        from the provider table in ingress/providers.py)
    signature_prefix    `hmac` only: text before the hex digest, e.g. "sha256="
    delivery_id_header  `hmac`, or a provider that sends none (stripe, slack): the header carrying
                        the sender's delivery id; github and standard use theirs

Each option can also be set from the environment as WEBHOOK_<SOURCE>_<OPTION>, e.g.
WEBHOOK_STRIPE_MAX_BODY_BYTES=262144 or WEBHOOK_SLACK_ENABLED=false.
"""

import json
import os
from functools import cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from ingress.providers import PROVIDERS, Provider

# Source is the verifiers' (ingress/verifiers/base.py): they take one, and this module builds it.
from ingress.verifiers.base import Source

__all__ = ["Source", "all_sources", "get_source", "reset_sources_cache"]


_BOOL_OPTIONS = {"enabled"}
_INT_OPTIONS = {"max_body_bytes", "max_header_bytes", "tolerance_seconds", "timeout_seconds"}
_STR_OPTIONS = {
    "provider",
    "secrets_env",
    "signature_header",
    "signature_prefix",
    "delivery_id_header",
}


def _coerce(source: str, option: str, value: object) -> object:
    where = f"webhook source {source!r}, option {option!r}"
    if option in _BOOL_OPTIONS:
        if isinstance(value, bool):
            return value
        return str(value).strip().lower() in {"1", "true", "yes", "on"}
    if option in _INT_OPTIONS:
        # Whole numbers only, as JSON numbers or text: not true/false, not 1.5.
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ImproperlyConfigured(f"{where}: must be an integer, got {value!r}")
        try:
            number = int(value)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{where}: must be an integer, got {value!r}") from exc
        if number <= 0:
            raise ImproperlyConfigured(f"{where}: must be positive, got {number}")
        return number
    if option in _STR_OPTIONS:
        return str(value)
    raise ImproperlyConfigured(f"{where}: unknown option")


def _build_source(name: str, declared: dict) -> Source:
    options: dict[str, object] = {
        "max_body_bytes": settings.WEBHOOK_DEFAULT_MAX_BODY_BYTES,
        "tolerance_seconds": settings.WEBHOOK_DEFAULT_TOLERANCE_SECONDS,
    }
    for option, value in declared.items():
        options[option] = _coerce(name, option, value)
    for option in _BOOL_OPTIONS | _INT_OPTIONS | _STR_OPTIONS:
        env_value = os.environ.get(f"WEBHOOK_{name.upper()}_{option.upper()}")
        if env_value not in (None, ""):
            options[option] = _coerce(name, option, env_value)

    provider = options.get("provider")
    if provider not in PROVIDERS:
        raise ImproperlyConfigured(
            f"webhook source {name!r}: provider must be one of {sorted(PROVIDERS)}, "
            f"got {provider!r}"
        )
    spec = PROVIDERS[str(provider)]
    if not spec.source_names_headers:
        _check_own_headers(name, spec, options)
    options.setdefault("secrets_env", f"WEBHOOK_{name.upper()}_SECRET")
    options.setdefault("signature_header", spec.signature_header)
    options.setdefault("delivery_id_header", spec.delivery_id_header)
    options.setdefault("timeout_seconds", spec.timeout_seconds)
    options["signature_header"] = str(options["signature_header"]).lower()
    options["delivery_id_header"] = str(options["delivery_id_header"]).lower()
    raw_secrets = os.environ.get(str(options["secrets_env"]), "")
    secrets = tuple(part.strip() for part in raw_secrets.split(",") if part.strip())
    # Each option was coerced to its field's type above (_BOOL_, _INT_, _STR_OPTIONS), which
    # a dict of them cannot tell the type checker.
    return Source(name=name, secrets=secrets, **options)  # type: ignore[arg-type]


def _check_own_headers(name: str, spec: Provider, options: dict[str, object]) -> None:
    """A named provider's verifier reads the provider's own headers (ingress/providers.py).

    A different signature header here would make the receive path demand a header the
    verifier never looks at, and a different delivery id header would change what the
    verifier keys the event by (and, for Standard Webhooks, the signed content). A source of
    a provider that sends no delivery id may still name one to record.
    """
    signature_header = str(options.get("signature_header", spec.signature_header)).lower()
    if signature_header != spec.signature_header:
        raise ImproperlyConfigured(
            f"webhook source {name!r}: signature_header can only be set for hmac sources "
            f"({spec.name} signs with {spec.signature_header})"
        )
    delivery_id_header = str(options.get("delivery_id_header", spec.delivery_id_header)).lower()
    if spec.delivery_id_header and delivery_id_header != spec.delivery_id_header:
        raise ImproperlyConfigured(
            f"webhook source {name!r}: delivery_id_header can only be set for hmac sources "
            f"and providers without one ({spec.name} sends {spec.delivery_id_header})"
        )


@cache
def all_sources() -> dict[str, Source]:
    declared: dict[str, dict] = {
        name: dict(options) for name, options in settings.WEBHOOK_SOURCES.items()
    }
    if settings.WEBHOOK_EXTRA_SOURCES:
        try:
            extra = json.loads(settings.WEBHOOK_EXTRA_SOURCES)
        except json.JSONDecodeError as exc:
            raise ImproperlyConfigured(f"WEBHOOK_EXTRA_SOURCES is not valid JSON: {exc}") from exc
        if not isinstance(extra, dict) or not all(isinstance(v, dict) for v in extra.values()):
            raise ImproperlyConfigured("WEBHOOK_EXTRA_SOURCES must be a JSON object of objects")
        for name, options in extra.items():
            declared[name] = {**declared.get(name, {}), **options}
    return {name: _build_source(name, options) for name, options in declared.items()}


def get_source(name: str) -> Source | None:
    """The enabled source called `name`, or None (unknown and disabled look the same)."""
    source = all_sources().get(name)
    if source is None or not source.enabled:
        return None
    return source


def reset_sources_cache(**kwargs: object) -> None:
    all_sources.cache_clear()


# Tests change settings and environment; the cached sources must follow.
setting_changed.connect(reset_sources_cache)
