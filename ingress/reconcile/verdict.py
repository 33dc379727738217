"""The inbox's verdict on a backfilled event: verified by fetch, not by signature.

A backfilled row holds an event a reconciliation run fetched itself from the provider's API
— over TLS (ingress/reconcile/stripe.py refuses a plain-HTTP API base other than loopback),
authenticated with our secret API key — because the signed webhook never reached us. There
is no signature to check, and none could be made up: the body is the provider's API object
re-serialised, not the bytes of a webhook. What vouches for it is who fetched it, from
where. That is only sound because nothing outside this package can mark a row
`backfilled`: the receive path always stores `origin = received`, whatever a request's
headers or body say.

So the verdict is `verified` with no matched secret (`matched_secret_index` stays NULL) and
the row's `origin` says why; the body still has to be the event object the provider sends
(a JSON object with its id and type), and the id is the usual dedup key, so a webhook for
the same event arriving later is a duplicate of the backfilled row, and the reverse.
"""

from ingress.models import RejectionReason
from ingress.sources import Source
from ingress.verifiers.base import StoredRequest, Verdict
from ingress.verifiers.common import (
    Reject,
    body_text,
    json_only_body,
    returns_verdict,
    string_field,
)

# Providers a reconciliation run backfills from (GitHub is asked to redeliver instead).
BACKFILL_PROVIDERS = frozenset({"stripe"})


@returns_verdict
def backfilled_verdict(source: Source, request: StoredRequest) -> Verdict:
    if source.provider not in BACKFILL_PROVIDERS:
        # Only a bug could have written such a row; re-verifiable once fixed.
        raise Reject(RejectionReason.VERIFIER_ERROR)
    event = json_only_body(request, body_text(request))
    event_id = string_field(event, "id")
    if not event_id or string_field(event, "object") != "event":
        raise Reject(RejectionReason.UNPARSEABLE_BODY)
    return Verdict(event_type=string_field(event, "type"), provider_event_id=event_id)
