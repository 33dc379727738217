"""Body-only signatures seen again (GitHub's X-Hub-Signature-256, generic HMAC senders).

Their signature covers the body and nothing else: no timestamp, no delivery id. A captured
request sent again under a new delivery id (X-GitHub-Delivery is not signed) verifies, and
dedup, which keys a GitHub event on that id, would take it for a new event. But the same
bytes under a new delivery id are also what a genuine event sends when the same thing
happens twice (a member added, removed and added again: GitHub's body carries no id or
time of its own). The signature alone cannot tell the two apart, so it decides nothing
final (docs/security.md, "Repeated body-only signatures"):

- the first verified request to carry a signature claims it in the dedup index, as the key
  `sig:<signature>` of its source: the unique index decides who is first, and the key lives
  as long as the event that claimed it (ingress/partitions.py deletes an event's keys with
  it), so for the raw events' retention;
- a later request carrying the same signature under the holder's delivery id, or under one
  already answered genuine, is a provider's redelivery, settled as before: dedup makes it
  a `duplicate`;
- under another delivery id it is `questioned`: neither handled nor rejected, with a
  SignatureQuestion naming the event it repeats, until the provider's delivery log
  (ingress/reconcile/signature_questions.py) or an operator answers whether this delivery
  was sent. Settled again with the answer (ingress.services.signature_question_answer): a
  genuine one is verified and deduplicated on its delivery id as any other, a replay is
  rejected `replayed_signature`. The answer stays with the event, so settling it again (a
  re-verify) gives the same verdict.

Called by the inbox's settle step (ingress/inbox.py) on the batch it has locked, in that
transaction, so a batch rolled back gives its claims back and questions nothing.
"""

import dataclasses
from datetime import datetime

from django.db.models import F

from ingress.models import (
    DedupKey,
    DispatchStatus,
    RawEvent,
    RejectionReason,
    SignatureAnswer,
    SignatureQuestion,
    SignatureStatus,
)
from ingress.payloads import raw_event_headers
from ingress.providers import body_only_signature, dedup_key_for
from ingress.sources import all_sources
from ingress.verifiers import Verdict

SIGNATURE_KEY_PREFIX = "sig:"


@dataclasses.dataclass(frozen=True)
class SignatureReplays:
    # Rejected `replayed_signature`: their question was answered so.
    verdicts: dict[int, Verdict]
    # Written `questioned` here, in the caller's transaction: the caller settles the others.
    questioned: frozenset[int]


def signature_replays_settle(
    events: list[RawEvent], verdicts: dict[int, Verdict], now: datetime
) -> SignatureReplays:
    """Question each verified event (in `verdicts`) whose body-only signature an event of
    another delivery id holds, unless its question was answered: a replay's verdict is
    replaced, a genuine one is left verified.

    `events` in received order: within a batch, the first to carry a signature claims it.
    """
    repeats = _repeated_elsewhere(events, verdicts, now)
    if not repeats:
        return SignatureReplays(verdicts={}, questioned=frozenset())
    answers = dict(
        SignatureQuestion.objects.filter(raw_event_id__in=list(repeats)).values_list(
            "raw_event_id", "answer"
        )
    )
    replayed = {
        event_id: dataclasses.replace(verdicts[event_id], reason=RejectionReason.REPLAYED_SIGNATURE)
        for event_id in repeats
        if answers.get(event_id) == SignatureAnswer.REPLAYED
    }
    questioned = [
        event
        for event in events
        if event.id in repeats
        and answers.get(event.id, SignatureAnswer.OPEN) == SignatureAnswer.OPEN
    ]
    _question(questioned, repeats, verdicts, now)
    return SignatureReplays(
        verdicts=replayed, questioned=frozenset(event.id for event in questioned)
    )


def _repeated_elsewhere(
    events: list[RawEvent], verdicts: dict[int, Verdict], now: datetime
) -> dict[int, int]:
    """{event id: the holder of its signature} for each verified event whose body-only
    signature an event of another delivery id holds; claims the signatures nobody holds."""
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
    repeats: dict[int, int] = {}
    for event in events:
        holder = holders.get(keys.get(event.id, ("", "")))
        if holder is None or holder == event.id:
            continue
        # A holder retention has already deleted cannot vouch for this one either.
        if delivery_ids.get(holder) != event.delivery_id:
            repeats[event.id] = holder
    return _without_known_deliveries(events, repeats, verdicts)


def _without_known_deliveries(
    events: list[RawEvent], repeats: dict[int, int], verdicts: dict[int, Verdict]
) -> dict[int, int]:
    """Leave out the events whose own dedup key (their delivery id) an event already holds:
    a redelivery of a delivery answered genuine, which dedup makes its `duplicate`."""
    if not repeats:
        return repeats
    own = {
        event.id: (event.source, dedup_key_for(event, verdicts[event.id]))
        for event in events
        if event.id in repeats
    }
    held = set(
        DedupKey.objects.filter(
            source__in={source for source, _ in own.values()},
            key__in={key for _, key in own.values()},
        ).values_list("source", "key")
    )
    return {event_id: holder for event_id, holder in repeats.items() if own[event_id] not in held}


def _question(
    events: list[RawEvent], repeats: dict[int, int], verdicts: dict[int, Verdict], now: datetime
) -> None:
    """Write each event `questioned` (what its verifier found, no dedup key, not dispatched)
    and open its question; rare, so one UPDATE each, on the event's partition."""
    if not events:
        return
    SignatureQuestion.objects.bulk_create(
        [
            SignatureQuestion(
                raw_event_id=event.id,
                source=event.source,
                delivery_id=event.delivery_id,
                received_at=event.received_at,
                repeats_id=repeats[event.id],
                asked_at=now,
            )
            for event in events
        ],
        ignore_conflicts=True,  # questioned before, and settled again: the same question
    )
    for event in events:
        verdict = verdicts[event.id]
        settled = {
            "signature_status": SignatureStatus.QUESTIONED,
            "rejection_reason": "",
            "verified_at": now,
            "event_type": verdict.event_type[:255],
            "matched_secret_index": verdict.secret_index,
            "provider_retry_num": verdict.provider_retry_num,
            "provider_retry_reason": verdict.provider_retry_reason[:64],
            "dedup_key": "",
            "duplicate_of_id": None,
            "dispatch_status": DispatchStatus.WAITING,
        }
        RawEvent.objects.filter(id=event.id, received_at=event.received_at).update(
            **settled, verify_count=F("verify_count") + 1
        )
        for name, value in settled.items():
            setattr(event, name, value)
        event.verify_count += 1
