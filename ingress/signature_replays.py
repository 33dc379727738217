"""Replays of body-only signatures (GitHub's X-Hub-Signature-256, generic HMAC senders).

Their signature covers the body and nothing else: no timestamp, no delivery id. A captured
request sent again under a new delivery id (X-GitHub-Delivery is not signed) verifies, and
dedup, which keys a GitHub event on that id, would take it for a new event. So the first
verified request to carry a signature claims it in the dedup index, as the key
`sig:<signature>` of its source: the unique index decides who is first, and the key lives as
long as the event that claimed it (ingress/partitions.py deletes an event's keys with it),
so for the raw events' retention. A later request carrying the same signature is

- the same delivery (its delivery id is the holder's): a provider's redelivery, settled as
  before — dedup makes it a `duplicate`;
- under another delivery id: a replay, rejected `replayed_signature` — stored, never
  dispatched.

Called by the inbox's settle step (ingress/inbox.py) on the batch it has locked, in that
transaction, so a batch rolled back gives its claims back.
"""

import dataclasses
from datetime import datetime

from ingress.models import DedupKey, RawEvent, RejectionReason
from ingress.payloads import raw_event_headers
from ingress.providers import body_only_signature
from ingress.sources import all_sources
from ingress.verifiers import Verdict

SIGNATURE_KEY_PREFIX = "sig:"


def signature_replay_verdicts(
    events: list[RawEvent], verdicts: dict[int, Verdict], now: datetime
) -> dict[int, Verdict]:
    """The verdicts to replace: {event id: rejected `replayed_signature`} for each verified
    event (in `verdicts`) whose body-only signature an event of another delivery holds.

    `events` in received order: within a batch, the first to carry a signature claims it.
    """
    keys: dict[int, tuple[str, str]] = {}
    claims: dict[tuple[str, str], RawEvent] = {}
    for event in events:
        source = all_sources().get(event.source)
        if source is None or not verdicts[event.id].ok:
            continue
        signature = body_only_signature(source, raw_event_headers(event))
        if signature:
            keys[event.id] = (event.source, SIGNATURE_KEY_PREFIX + signature)
            claims.setdefault(keys[event.id], event)
    if not keys:
        return {}
    # Sorted, as the dedup keys are, so that two workers lock overlapping keys in one order.
    DedupKey.objects.bulk_create(
        [
            DedupKey(source=source, key=key, raw_event_id=event.id, created_at=now)
            for (source, key), event in sorted(claims.items(), key=lambda claim: claim[0])
        ],
        ignore_conflicts=True,
    )
    # After the INSERT waited for any conflicting one to commit: who holds each key now.
    holders = {
        (row.source, row.key): row.raw_event_id
        for row in DedupKey.objects.filter(
            source__in={source for source, _ in claims}, key__in={key for _, key in claims}
        )
    }
    delivery_ids = {event.id: event.delivery_id for event in events}
    elsewhere = set(holders.values()) - delivery_ids.keys()
    delivery_ids |= dict(RawEvent.objects.filter(id__in=elsewhere).values_list("id", "delivery_id"))
    replays: dict[int, Verdict] = {}
    for event in events:
        holder = holders.get(keys.get(event.id, ("", "")))
        if holder is None or holder == event.id:
            continue
        # A holder retention has already deleted cannot vouch for this one: a replay too.
        if delivery_ids.get(holder) != event.delivery_id:
            replays[event.id] = dataclasses.replace(
                verdicts[event.id], reason=RejectionReason.REPLAYED_SIGNATURE
            )
    return replays
