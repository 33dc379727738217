"""The cap on what requests that fail verification may store: junk cannot fill the store.

The receive path stores anything that carries its source's signature header before anyone
knows whether it is signed (so a webhook is never lost to a slow verification). A flood of
large junk is therefore stored at full size until the inbox rejects it. Here, on its first
verification, a rejected request's payload (body and headers) counts against its source's
INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE for the minute it arrived in; past the cap the
payload is dropped — the body emptied, the headers too — and `payload_dropped_bytes` says how
much there was. The row keeps the rest (source, path, sender's address, delivery id, body
hash, times, the rejection), so the flood stays visible and countable. Re-verifying a row
later stores nothing new and is not counted.

Kept bytes per (source, minute) are one RejectedPayloadMinute row, locked while a batch
decides (any number of inbox workers share the cap), with the count of what was dropped
(/metrics: eventdrop_rejected_payloads_dropped_total). The figure and its reasoning:
docs/security.md.
"""

import json
import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Case, F, IntegerField, Value, When

from ingress.models import RawEvent, RejectedPayloadMinute
from ingress.verifiers import Verdict

logger = logging.getLogger(__name__)


def payload_bytes(event: RawEvent) -> int:
    """What the row stores of the request: the body as stored, and the headers as JSON."""
    headers = json.dumps(event.headers, separators=(",", ":"), ensure_ascii=False)
    return len(event.body) + len(headers.encode())


def rejected_payloads_cap(
    events: list[RawEvent], verdicts: dict[int, Verdict], now: datetime
) -> list[int]:
    """Drop the payloads of the first-time rejections in `events` (locked by the caller,
    in received order) past their source's cap for the minute they arrived in. Returns the
    ids dropped; the in-memory events are changed to match."""
    by_minute: dict[tuple[str, datetime], list[RawEvent]] = defaultdict(list)
    for event in events:
        if not verdicts[event.id].ok and event.verify_count == 0:
            minute = event.received_at.replace(second=0, microsecond=0)
            by_minute[(event.source, minute)].append(event)
    if not by_minute:
        return []
    cap = settings.INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE
    dropped: dict[int, int] = {}  # event id -> its payload's bytes
    # Sorted: two workers lock the same minutes in the same order.
    for (source, minute), rejected in sorted(by_minute.items()):
        RejectedPayloadMinute.objects.bulk_create(
            [RejectedPayloadMinute(source=source, minute=minute)], ignore_conflicts=True
        )
        budget = RejectedPayloadMinute.objects.select_for_update().get(source=source, minute=minute)
        kept = budget.kept_bytes
        over: dict[int, int] = {}
        for event in rejected:
            size = payload_bytes(event)
            if kept + size <= cap:
                kept += size
            else:
                over[event.id] = size
        RejectedPayloadMinute.objects.filter(pk=budget.pk).update(
            kept_bytes=kept,
            dropped=F("dropped") + len(over),
            dropped_bytes=F("dropped_bytes") + sum(over.values()),
        )
        dropped |= over
    if dropped:
        _drop_payloads(events, dropped)
    RejectedPayloadMinute.objects.filter(
        minute__lt=now - timedelta(days=settings.RAW_EVENT_REJECTED_RETENTION_DAYS)
    ).delete()
    return list(dropped)


def _drop_payloads(events: list[RawEvent], dropped: dict[int, int]) -> None:
    gone = [event for event in events if event.id in dropped]
    received = [event.received_at for event in gone]
    RawEvent.objects.filter(
        id__in=list(dropped),
        # The batch's days only: PostgreSQL prunes to their partitions.
        received_at__gte=min(received),
        received_at__lte=max(received),
    ).update(
        body=b"",
        headers={},
        payload_dropped_bytes=Case(
            *(When(id=event_id, then=Value(size)) for event_id, size in dropped.items()),
            output_field=IntegerField(),
        ),
    )
    for event in gone:
        event.body, event.headers = b"", {}
        event.payload_dropped_bytes = dropped[event.id]
    logger.warning(
        "ingress.verify.rejected_payloads_dropped",
        extra={
            "events": len(gone),
            "bytes": sum(dropped.values()),
            "sources": sorted({event.source for event in gone}),
        },
    )
