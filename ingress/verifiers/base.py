"""What every provider verifier takes and returns: `verify(source, request) -> Verdict`.

A verifier gets the *stored* request (lower-case header names, exact body bytes, the row's
received_at) and the source's configuration, and returns a Verdict. It never raises for bad
input: every malformed header, timestamp, encoding or body ends in a Verdict with a reason
from ingress.models.RejectionReason. Timestamps are judged against `received_at`, not now, so
a backlog or a re-verification after a secret fix gives the same answer as at arrival.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True)
class Source:
    """A configured webhook source (built by ingress/sources.py from settings and the
    environment): what a verifier checks a request against."""

    name: str
    provider: str
    secrets_env: str
    # repr=False keeps secrets out of tracebacks, logs and admin output.
    secrets: tuple[str, ...] = field(repr=False, default=())
    enabled: bool = True
    max_body_bytes: int = 1024 * 1024
    # Providers send a few hundred bytes to a few KiB of headers; every byte is stored.
    max_header_bytes: int = 32 * 1024
    tolerance_seconds: int = 300
    timeout_seconds: int | None = None
    signature_header: str = ""
    signature_prefix: str = ""
    delivery_id_header: str = ""

    @property
    def has_secret(self) -> bool:
        return bool(self.secrets)


@dataclass(frozen=True)
class StoredRequest:
    headers: Mapping[str, str]  # lower-case names, as stored on RawEvent.headers
    body: bytes
    received_at: datetime  # aware


@dataclass(frozen=True)
class Verdict:
    # "" when the signature checked out, else a RejectionReason value.
    reason: str = ""
    # Index into Source.secrets of the secret that matched (rotation visibility).
    secret_index: int | None = None
    # What the body says it is, for routing to handlers (e.g. "checkout.session.completed").
    event_type: str = ""
    # The provider's own id of the event, the preferred dedup key ("" when it has none).
    provider_event_id: str = ""
    # Slack's X-Slack-Retry-Num / -Reason, recorded for forensics.
    provider_retry_num: int | None = None
    provider_retry_reason: str = ""
    # Slack url_verification: the challenge to echo synchronously.
    handshake_challenge: str | None = None

    @property
    def ok(self) -> bool:
        return self.reason == ""
