"""The provider table: every provider type a webhook source can have, declared once.

One row per provider says all the project knows about it:

- `signature_header` — the header the receive path requires before it stores anything (it only
  checks that the header is there; all signature math happens later, in the verifier);
- `delivery_id_header` — the header carrying the sender's id of this delivery attempt, copied
  by the receive path onto RawEvent.delivery_id ("" when the provider sends none);
- `verify` — the provider's verifier (ingress/verifiers/<name>.py), called on the stored
  request by the inbox; it reads both headers from the Source, which ingress/sources.py fills
  from this table (only `hmac` sources may name their own);
- `dedup_key` — how a verified event's dedup key is made (ingress.models.DedupKey decides
  the winner);
- `body_signature` — for a provider whose signature covers the body only (no timestamp, no
  delivery id in what is signed: GitHub, generic HMAC), the verified signature itself, which
  identifies the request: the same signature under a new delivery id is a replay
  (ingress/signature_replays.py). The others bound replays themselves (a signed timestamp or id);
- `timeout_seconds` — how long the provider waits for our answer before it counts the delivery
  as failed (its own documentation): a source's request budget, overridable per source
  (ingress/sources.py; the arithmetic in kernel/budgets.py). None: it publishes none, and
  the route's WEBHOOK_REQUEST_BUDGET_SECONDS applies.

Look a provider up by name with `PROVIDERS[name]`; `verify` and `dedup_key_for` below are the
two entry points the inbox calls. Header names are lower-case: that is how RawEvent.headers
stores them. The verifiers are imported here, statically: there is no other registry.
"""

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ingress.models import RawEvent, RejectionReason
from ingress.payloads import raw_event_body, raw_event_headers
from ingress.verifiers import github, hmac, slack, standard, stripe
from ingress.verifiers.base import Source, StoredRequest, Verdict
from ingress.verifiers.common import scheme_hex_signature, sha256_hex

logger = logging.getLogger(__name__)

Verifier = Callable[[Source, StoredRequest], Verdict]
DedupRule = Callable[[RawEvent, Verdict], str]
# (source, the stored headers) -> the signature, lower-case hex, of a request that verified.
BodySignature = Callable[[Source, Mapping[str, str]], str]

# Headers that identify *what* was sent rather than *this attempt* at sending it; signature
# and timestamp headers change on every provider retry and would defeat the fallback key.
_FALLBACK_KEY_HEADERS = ("content-type",)
# A dedup key made from the body's bytes: it confirms a guessed body as its hash does, so the
# console shows it only with the payload permission (docs/security.md).
CONTENT_HASH_KEY_PREFIX = "sha256:"


def is_content_hash_key(key: str) -> bool:
    return key.startswith(CONTENT_HASH_KEY_PREFIX)


def provider_event_id_or_content_hash(event: RawEvent, verdict: Verdict) -> str:
    """The provider's own event id when its verifier found one, else a hash of what was sent.

    The id is what makes a provider's retry of the same event a duplicate (Stripe's `evt_…`,
    Slack's `event_id`, the delivery id GitHub and Standard Webhooks send). Without one, two
    deliveries are the same event when source, path, event type, content type and body bytes
    all match.
    """
    if verdict.provider_event_id:
        return f"id:{verdict.provider_event_id}"[:300]
    digest = hashlib.sha256()
    for part in (event.source, event.path, verdict.event_type):
        digest.update(part.encode("utf-8") + b"\0")
    headers = raw_event_headers(event)
    for name in _FALLBACK_KEY_HEADERS:
        digest.update(f"{name}:{headers.get(name, '')}".encode() + b"\0")
    digest.update(raw_event_body(event))  # the plaintext: ciphertexts differ every time
    return f"{CONTENT_HASH_KEY_PREFIX}{digest.hexdigest()}"


def github_body_signature(source: Source, headers: Mapping[str, str]) -> str:
    return scheme_hex_signature(headers[source.signature_header], github.SCHEME)


def hmac_body_signature(source: Source, headers: Mapping[str, str]) -> str:
    return sha256_hex(headers[source.signature_header].removeprefix(source.signature_prefix))


@dataclass(frozen=True)
class Provider:
    name: str
    verify: Verifier
    signature_header: str
    delivery_id_header: str = ""
    dedup_key: DedupRule = provider_event_id_or_content_hash
    # Only generic senders name their own headers per source (signature_header,
    # signature_prefix, delivery_id_header in ingress/sources.py); a named provider's
    # verifier reads the provider's own, so a source may not point it elsewhere.
    source_names_headers: bool = False
    body_signature: BodySignature | None = None
    timeout_seconds: int | None = None


PROVIDERS: dict[str, Provider] = {
    provider.name: provider
    for provider in (
        # Event id: the body's `id` (evt_…); no delivery id header. Stripe publishes no
        # response timeout.
        Provider("stripe", stripe.verify, signature_header="stripe-signature"),
        # Event id: X-GitHub-Delivery (GitHub's body has no event id), which is not signed.
        # GitHub drops the connection of an answer that takes more than 10 s.
        Provider(
            "github",
            github.verify,
            signature_header="x-hub-signature-256",
            delivery_id_header="x-github-delivery",
            body_signature=github_body_signature,
            timeout_seconds=10,
        ),
        # Event id: the body's `event_id` (Events API); slash commands and interactivity
        # have none and fall back to the content hash. Slack wants an answer within 3 s.
        Provider("slack", slack.verify, signature_header="x-slack-signature", timeout_seconds=3),
        # Event id: webhook-id, which is also part of the signed content. The specification
        # recommends a request timeout between 15 and 30 s: its lower end.
        Provider(
            "standard",
            standard.verify,
            signature_header="webhook-signature",
            delivery_id_header="webhook-id",
            timeout_seconds=15,
        ),
        # Event id: the source's delivery id header, else the body's `id`.
        Provider(
            "hmac",
            hmac.verify,
            signature_header="x-signature",
            source_names_headers=True,
            body_signature=hmac_body_signature,
        ),
    )
}


def verify(source: Source, request: StoredRequest) -> Verdict:
    """Verify one stored request with its source's provider verifier.

    Verifiers return reasons for every bad input they know of; the catch-all below exists so
    that a verifier *bug* marks one row `verifier_error` (re-verifiable once fixed) instead of
    stalling the worker on the same row forever.
    """
    if not source.secrets:
        return Verdict(reason=RejectionReason.NO_SECRET_CONFIGURED)
    verifier = PROVIDERS[source.provider].verify
    try:
        return verifier(source, request)
    except Exception:
        logger.exception("ingress.verify.verifier_error", extra={"source": source.name})
        return Verdict(reason=RejectionReason.VERIFIER_ERROR)


def dedup_key_for(event: RawEvent, verdict: Verdict) -> str:
    """The dedup key of a verified event, by the rule of the provider that sent it."""
    return PROVIDERS[event.provider].dedup_key(event, verdict)


def body_only_signature(source: Source, headers: Mapping[str, str]) -> str:
    """The verified signature of a request whose provider signs the body only, else ""."""
    rule = PROVIDERS[source.provider].body_signature
    return rule(source, headers) if rule else ""
