"""Reads about the outbox: queue depths for the console, the API and /metrics."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone

from ingress.selectors import any_status
from outbox.models import (
    CircuitBreaker,
    RecapSideEffect,
    RecapSideEffectAttempt,
    SideEffectStatus,
    WaitReason,
)

QUEUE_STATUSES = (SideEffectStatus.PENDING, SideEffectStatus.PROCESSING, SideEffectStatus.DEAD)
# Why pending rows wait (the empty reason, "new or re-armed", is not a wait).
WAIT_REASONS = [reason for reason in WaitReason.values if reason]


def side_effect_depths(*, now: datetime | None = None) -> dict:
    """Rows per status, how many are due, and how long the oldest due row has waited.

    One aggregate query over the pending, processing and dead rows. `stale_processing`
    counts rows a dead worker left behind (they are re-armed by the next dispatcher run);
    `oldest_due_age_seconds` is None when nothing is due, and is the figure to alert on: it
    grows when the dispatcher is not running.
    `waiting` counts pending rows by why they wait: `breaker` (the render service or its
    deploy answered about itself, or its breaker is open), `ambiguous` (an answer neither a
    render nor a verdict), `database` (our own database failed), `configuration` (ours was
    incomplete) — none of them charged — and `own_error` (their own last attempt failed;
    charged). `oldest_waiting_age_seconds`: how long the longest of those uncharged waits
    has lasted (None when no row waits on anyone): the figure the alert on rows that wait
    without a verdict reads (deploy/prometheus/alerts.yml, EventDropRenderWaitingLong).
    """
    now = now or timezone.now()
    stale_before = now - timedelta(seconds=settings.OUTBOX_STALE_PROCESSING_SECONDS)
    due = Q(status=SideEffectStatus.PENDING, next_attempt_at__lte=now)
    # Only the rows that wait or need a human, each status from its partial index: `done` is
    # volume, not depth, and counting it would read every side effect ever made.
    row = RecapSideEffect.objects.filter(any_status(*QUEUE_STATUSES)).aggregate(
        **{str(status): Count("id", filter=Q(status=status)) for status in QUEUE_STATUSES},
        due=Count("id", filter=due),
        stale_processing=Count(
            "id", filter=Q(status=SideEffectStatus.PROCESSING, claimed_at__lt=stale_before)
        ),
        oldest_due=Min("next_attempt_at", filter=due),
        oldest_waiting=Min(
            "waiting_since",
            filter=Q(status=SideEffectStatus.PENDING, waiting_since__isnull=False),
        ),
        **{
            f"waiting_{reason}": Count(
                "id", filter=Q(status=SideEffectStatus.PENDING, wait_reason=reason)
            )
            for reason in WAIT_REASONS
        },
    )
    oldest_due = row.pop("oldest_due")
    oldest_waiting = row.pop("oldest_waiting")
    waiting = {reason: row.pop(f"waiting_{reason}") for reason in WAIT_REASONS}
    return {
        **row,
        "waiting": waiting,
        "oldest_due_age_seconds": _age(oldest_due, now),
        "oldest_waiting_age_seconds": _age(oldest_waiting, now),
    }


def _age(since: datetime | None, now: datetime) -> float | None:
    return None if since is None else max((now - since).total_seconds(), 0.0)


def side_effect_history(*, side_effect: RecapSideEffect) -> QuerySet[RecapSideEffectAttempt]:
    return RecapSideEffectAttempt.objects.filter(side_effect=side_effect).order_by("id")


def side_effect_list(*, status: str | None = None) -> QuerySet[RecapSideEffect]:
    queryset = RecapSideEffect.objects.select_related("recap").order_by("next_attempt_at", "id")
    return queryset if status is None else queryset.filter(status=status)


def circuit_breaker_get(*, name: str) -> CircuitBreaker | None:
    return CircuitBreaker.objects.filter(name=name).first()
