"""Reads about the inbox: queue depths and lags, for the console, the API and /metrics."""

from datetime import datetime, timedelta

from django.db.models import Count, Min
from django.utils import timezone

from ingress.models import Delivery, DeliveryStatus, RawEvent, SignatureStatus


def inbox_depths(*, now: datetime | None = None) -> dict:
    """Work waiting in the inbox, and how old its oldest item is (seconds)."""
    now = now or timezone.now()
    pending = RawEvent.objects.filter(signature_status=SignatureStatus.PENDING).aggregate(
        count=Count("id"), oldest=Min("received_at")
    )
    deliveries = dict(
        Delivery.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n")
    )
    oldest_due = Delivery.objects.filter(
        status=DeliveryStatus.PENDING, next_attempt_at__lte=now
    ).aggregate(oldest=Min("next_attempt_at"))["oldest"]
    return {
        "raw_events_pending": pending["count"],
        "raw_events_oldest_pending_age_seconds": _age(now, pending["oldest"]),
        "deliveries": {status: deliveries.get(status, 0) for status in DeliveryStatus.values},
        "deliveries_oldest_due_age_seconds": _age(now, oldest_due),
    }


def _age(now: datetime, since: datetime | None) -> float | None:
    return None if since is None else max((now - since).total_seconds(), 0.0)


def inbox_lag_samples(*, since: timedelta = timedelta(hours=1)) -> dict[str, list[float]]:
    """Lag samples (seconds) for events received in the window: receipt→verdict→handled."""
    rows = RawEvent.objects.filter(
        received_at__gte=timezone.now() - since, verified_at__isnull=False
    ).values_list("received_at", "verified_at", "handled_at")
    verify_lag, handle_lag = [], []
    for received_at, verified_at, handled_at in rows:
        verify_lag.append((verified_at - received_at).total_seconds())
        if handled_at is not None:
            handle_lag.append((handled_at - verified_at).total_seconds())
    return {"verification": verify_lag, "processing": handle_lag}
