"""Reads about the inbox: queue depths and lags, for the console, the API and /metrics."""

from datetime import datetime

from django.db.models import Count, Min
from django.utils import timezone

from ingress.models import Delivery, DeliveryStatus, RawEvent, SignatureStatus

QUEUE_STATUSES = (DeliveryStatus.PENDING, DeliveryStatus.PROCESSING, DeliveryStatus.DEAD)


def inbox_depths(*, now: datetime | None = None) -> dict:
    """Work waiting in the inbox, and how old its oldest item is (seconds)."""
    now = now or timezone.now()
    pending = RawEvent.objects.filter(signature_status=SignatureStatus.PENDING).aggregate(
        count=Count("id"), oldest=Min("received_at")
    )
    # Only the statuses that are work or need a human: each count reads its own partial
    # index. `done` is volume, not depth, and counting it would scan every delivery ever made.
    deliveries = {
        status: Delivery.objects.filter(status=status).count() for status in QUEUE_STATUSES
    }
    oldest_due = Delivery.objects.filter(
        status=DeliveryStatus.PENDING, next_attempt_at__lte=now
    ).aggregate(oldest=Min("next_attempt_at"))["oldest"]
    return {
        "raw_events_pending": pending["count"],
        "raw_events_oldest_pending_age_seconds": _age(now, pending["oldest"]),
        "deliveries": deliveries,
        "deliveries_oldest_due_age_seconds": _age(now, oldest_due),
    }


def _age(now: datetime, since: datetime | None) -> float | None:
    return None if since is None else max((now - since).total_seconds(), 0.0)
