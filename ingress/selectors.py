"""Reads about the inbox: queue depths and lags, and the handlers' pauses, for the console,
the API and /metrics."""

import operator
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import reduce

from django.conf import settings
from django.db.models import Count, Exists, Min, OuterRef, Q, Sum
from django.utils import timezone

from ingress.models import (
    Delivery,
    DeliveryStatus,
    HandlerPace,
    HandlerPause,
    RawEvent,
    RawEventClaim,
    RawEventClaimStatus,
    RejectedPayloadMinute,
    SignatureStatus,
)

QUEUE_STATUSES = (
    DeliveryStatus.PENDING,
    DeliveryStatus.PROCESSING,
    DeliveryStatus.DEAD,
    DeliveryStatus.HELD,
)


def inbox_depths(*, now: datetime | None = None) -> dict:
    """Work waiting in the inbox, and how old its oldest item is (seconds)."""
    now = now or timezone.now()
    pending = RawEvent.objects.filter(signature_status=SignatureStatus.PENDING).aggregate(
        count=Count("id"), oldest=Min("received_at")
    )
    # Repeated body-only signatures waiting for an answer (ingress/signature_replays.py):
    # verified, neither handled nor rejected. Their own partial index, as pending's.
    questioned = RawEvent.objects.filter(signature_status=SignatureStatus.QUESTIONED).aggregate(
        count=Count("id"), oldest=Min("received_at")
    )
    # Only the statuses that are work or need a human, in one query on their partial indexes.
    # `done` is volume, not depth, and counting it would scan every delivery ever made.
    # OR, not IN: each arm is a partial index's predicate, so the planner reads those.
    counted = Delivery.objects.filter(any_status(*QUEUE_STATUSES)).aggregate(
        **{str(status): Count("id", filter=Q(status=status)) for status in QUEUE_STATUSES},
        oldest_due=Min(
            "next_attempt_at",
            filter=Q(status=DeliveryStatus.PENDING, next_attempt_at__lte=now),
        ),
    )
    oldest_due = counted.pop("oldest_due")
    deliveries = {status: counted[status] for status in QUEUE_STATUSES}
    return {
        "raw_events_pending": pending["count"],
        "raw_events_oldest_pending_age_seconds": _age(now, pending["oldest"]),
        "raw_events_questioned": questioned["count"],
        "raw_events_oldest_questioned_age_seconds": _age(now, questioned["oldest"]),
        "deliveries": deliveries,
        "deliveries_oldest_due_age_seconds": _age(now, oldest_due),
    }


def any_status(*statuses: str) -> Q:
    """`status` is one of them, as an OR the planner matches with each status's partial index
    (an IN list matches none of them, and a scan of the table follows)."""
    return reduce(operator.or_, (Q(status=status) for status in statuses))


def _age(now: datetime, since: datetime | None) -> float | None:
    return None if since is None else max((now - since).total_seconds(), 0.0)


@dataclass(frozen=True)
class ActivePause:
    id: int
    handler: str  # one of handler and source is set
    source: str
    paused_at: datetime
    age_seconds: float
    held: int  # deliveries it holds right now

    @property
    def scope(self) -> str:
        return f"handler {self.handler}" if self.handler else f"source {self.source}"


def handler_pauses_active(*, now: datetime | None = None) -> list[ActivePause]:
    """The pauses in force, oldest first, with their age and how many deliveries each holds.

    One count per pause (few: an operator's, during an incident), each read from the
    delivery_held partial index; a source's count joins its events.
    """
    now = now or timezone.now()
    pauses = HandlerPause.objects.filter(resumed_at__isnull=True).order_by("paused_at", "id")
    return [
        ActivePause(
            id=pause.id,
            handler=pause.handler,
            source=pause.source,
            paused_at=pause.paused_at,
            age_seconds=_age(now, pause.paused_at) or 0.0,
            held=_held_by(pause),
        )
        for pause in pauses
    ]


def deliveries_held_count() -> int:
    """Every held delivery, whichever pause holds it (for the ops page and /metrics)."""
    return Delivery.objects.filter(status=DeliveryStatus.HELD).count()


def deliveries_superseded_count() -> int:
    """Deliveries an ordered handler never ran: a newer event of their key was handled first
    (each with the delivery it lost to; a forced replay runs it)."""
    return Delivery.objects.filter(status=DeliveryStatus.SUPERSEDED).count()


def _held_by(pause: HandlerPause) -> int:
    held = Delivery.objects.filter(status=DeliveryStatus.HELD)
    if pause.handler:
        return held.filter(handler=pause.handler).count()
    return held.filter(
        Exists(RawEvent.objects.filter(id=OuterRef("raw_event_id"), source=pause.source))
    ).count()


def rejected_payloads_dropped() -> dict[str, int]:
    """Per source, how many rejected requests lost their payload to the cap
    (ingress/rejected_payloads.py), over the minutes still accounted for."""
    rows = RejectedPayloadMinute.objects.values("source").annotate(dropped=Sum("dropped"))
    return {row["source"]: row["dropped"] for row in rows}


@dataclass(frozen=True)
class LaneBacklog:
    """One source's or handler's unfinished work: waiting, and claimed by a worker now."""

    waiting: int
    in_flight: int
    held: int = 0  # deliveries a pause holds (neither waiting to run nor running)


def source_backlogs() -> dict[str, LaneBacklog]:
    """Raw events to verify per source, and how many of them a worker's claim holds now
    (claims older than the lease are the re-arm's, not in flight). One read of the pending
    index and the claims' key; costs the backlog, not the store."""
    lease_ended = timezone.now() - timedelta(seconds=settings.INBOX_CLAIM_LEASE_SECONDS)
    claimed = RawEventClaim.objects.filter(
        raw_event_id=OuterRef("id"),
        status=RawEventClaimStatus.PROCESSING,
        claimed_at__gt=lease_ended,
    )
    rows = (
        RawEvent.objects.filter(signature_status=SignatureStatus.PENDING)
        .values("source")
        .annotate(pending=Count("id"), claimed=Count("id", filter=Exists(claimed)))
        .order_by()
    )
    return {
        row["source"]: LaneBacklog(
            waiting=row["pending"] - row["claimed"], in_flight=row["claimed"]
        )
        for row in rows
    }


def handler_backlogs() -> dict[str, LaneBacklog]:
    """Deliveries per handler: due or waiting to retry, running now, held by a pause. One
    read of the three partial indexes of unfinished deliveries."""
    rows = (
        Delivery.objects.filter(
            any_status(DeliveryStatus.PENDING, DeliveryStatus.PROCESSING, DeliveryStatus.HELD)
        )
        .values("handler")
        .annotate(
            **{
                str(status): Count("id", filter=Q(status=status))
                for status in (
                    DeliveryStatus.PENDING,
                    DeliveryStatus.PROCESSING,
                    DeliveryStatus.HELD,
                )
            }
        )
        .order_by()
    )
    return {
        row["handler"]: LaneBacklog(
            waiting=row[DeliveryStatus.PENDING],
            in_flight=row[DeliveryStatus.PROCESSING],
            held=row[DeliveryStatus.HELD],
        )
        for row in rows
    }


def handler_paces() -> dict[str, HandlerPace]:
    """Every handler's pace row (limited handlers, and those a downstream slowed)."""
    return {pace.handler: pace for pace in HandlerPace.objects.all()}
