"""What the dispatcher needs before it may touch a row, decided in one place.

A missing setting is our fault, not the recap's. Started without RENDER_SERVICE_URL, the old
dispatcher claimed paid recaps and wrote them `failed` ("not_configured"). Now every entry
point that talks to the render service — `dispatch_side_effects` (once and as a loop),
`recover_recaps`, and their django-q2 tasks — calls `require_dispatch_configuration()`
first and refuses to run, touching no row; and the system check (outbox/checks.py) reports
the same list: an error for a deployment (DEBUG off), a warning in development.

Values are never quoted in messages: a URL can carry credentials.
"""

from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from ingress.sources import all_sources

REFUSAL = "{who} refuses to run: {problems}. No row was touched; see `manage.py check`."


class DispatchNotConfigured(ImproperlyConfigured):
    """The dispatcher's configuration is incomplete; nothing was dispatched."""

    def __init__(self, *, who: str, problems: list[str]):
        super().__init__(REFUSAL.format(who=who, problems="; ".join(problems)))
        self.problems = problems


def _is_http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def dispatch_configuration_problems() -> list[str]:
    """What is missing for a render to be requested and its completion to come back.

    - RENDER_SERVICE_URL: where renders are requested (and their status asked);
    - RENDER_CALLBACK_URL: where the service reports completion;
    - the renderer webhook source (RENDER_WEBHOOK_SOURCE, Standard Webhooks) with a secret:
      without it every completion callback is rejected and no recap ever becomes ready.
    """
    problems: list[str] = []
    for name in ("RENDER_SERVICE_URL", "RENDER_CALLBACK_URL"):
        value = getattr(settings, name, "")
        if not value:
            problems.append(f"{name} is not set")
        elif not _is_http_url(value):
            problems.append(f"{name} is not an http(s) URL")
    name = settings.RENDER_WEBHOOK_SOURCE
    try:
        source = all_sources().get(name)
    except ImproperlyConfigured:
        problems.append("the webhook sources are misconfigured (ingress.E001)")
        return problems
    if source is None:
        problems.append(f"RENDER_WEBHOOK_SOURCE names no webhook source ({name!r})")
    elif not source.enabled:
        problems.append(f"the webhook source {name!r} is disabled (callbacks would get 404)")
    elif source.provider != "standard":
        problems.append(
            f"the webhook source {name!r} is not a Standard Webhooks source "
            f"(provider {source.provider!r})"
        )
    elif not source.has_secret:
        problems.append(
            f"{source.secrets_env} is not set (every render callback would be rejected)"
        )
    return problems


def require_dispatch_configuration(*, who: str) -> None:
    """Raise DispatchNotConfigured (one line, every problem) unless dispatch can work."""
    problems = dispatch_configuration_problems()
    if problems:
        raise DispatchNotConfigured(who=who, problems=problems)


def dispatch_command_start(command: BaseCommand, *, who: str, skip_checks: bool) -> None:
    """How a command that dispatches or recovers starts: it refuses at once, as one line and
    touching no row, when the configuration above is incomplete; then the system checks run
    (unless skipped: `make run` checks once for every process it starts)."""
    try:
        require_dispatch_configuration(who=who)
    except DispatchNotConfigured as exc:
        raise CommandError(str(exc)) from exc
    if not skip_checks:
        command.check()
