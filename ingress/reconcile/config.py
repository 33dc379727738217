"""What a run needs from configuration before it may talk to a provider."""

import ipaddress
from urllib.parse import urlsplit

from ingress.reconcile.errors import NOT_TLS, UNKNOWN_SOURCE, ReconcileFailed, ReconcileInvalid
from ingress.sources import Source, all_sources

_LOOPBACK_NAMES = {"localhost"}


def reconcile_source(*, name: str, provider: str) -> Source:
    """The configured source whose dedup index a run compares with."""
    source = all_sources().get(name)
    if source is None or source.provider != provider:
        raise ReconcileInvalid(UNKNOWN_SOURCE.format(source=name, provider=provider))
    return source


def require_tls(url: str, *, setting: str, purpose: str) -> None:
    """An API base must be https: backfilled events are trusted because of where they came
    from, and the API key or token travels with every call. Loopback is exempt (tests and
    local fakes); anything else in plain HTTP is a configuration error."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return
    host = parts.hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host in _LOOPBACK_NAMES
    if parts.scheme == "http" and loopback:
        return
    # Scheme and host only: a URL can carry credentials, which must not reach the message.
    shown = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    raise ReconcileFailed(NOT_TLS.format(setting=setting, url=shown, purpose=purpose))
