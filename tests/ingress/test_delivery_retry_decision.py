"""Deliveries on the project's one retry decision (eventdrop/retry.py, issue 9).

The inbox and the outbox used to be two retry state machines with different rules. Now both
classify a failure with `eventdrop.retry.classify` (one table: our database's errors are
transient, PermanentHandlerError and an unparseable body permanent) and record the
`RetryStrategy` decision fenced on (claimed_at, attempts).
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from eventdrop.retry import classify
from ingress.deliveries import (
    _claim_due_deliveries,
    _Failure,
    _record_failure,
    deliveries_rearm_stale,
    deliveries_run_due,
)
from ingress.handlers import PermanentHandlerError, unregister, webhook_handler
from ingress.inbox import raw_events_verify_batch
from ingress.models import Delivery, DeliveryAttempt
from tests.ingress import test_inbox
from tests.ingress.test_inbox import receive_github

pytestmark = pytest.mark.django_db

push_handler = test_inbox.push_handler  # the fixture: a registered `push` handler


@pytest.fixture
def statement_timeout_handler():
    """A handler whose query PostgreSQL cancels (statement timeout): a real database error."""

    def on_push(event, payload):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = 1")
            cursor.execute("SELECT pg_sleep(0.2)")

    webhook_handler(provider="github", event_types=["push"])(on_push)
    yield
    unregister(f"{on_push.__module__}.{on_push.__qualname__}")


def test_a_database_error_in_a_handler_is_never_charged(client, statement_timeout_handler):
    receive_github(client)
    raw_events_verify_batch()
    assert deliveries_run_due() == 1
    delivery = Delivery.objects.get()
    # Our database, not the delivery: released, the attempt given back, waiting since now.
    assert (delivery.status, delivery.attempts) == ("pending", 0)
    assert delivery.first_failed_at is None and delivery.waiting_since is not None
    assert delivery.last_error.startswith("OperationalError: ")
    assert DeliveryAttempt.objects.get(delivery=delivery).outcome == "released"


def test_a_handlers_own_failure_lives_until_attempts_and_the_horizon(client, settings):
    """Deliveries have the outbox's horizon (DELIVERY_TRANSIENT_HORIZON_SECONDS): after
    DELIVERY_MAX_ATTEMPTS charged failures, a delivery dies only once its first charged
    failure lies the horizon back; the pause before the last attempt reaches it."""
    settings.DELIVERY_MAX_ATTEMPTS = 3
    settings.DELIVERY_TRANSIENT_HORIZON_SECONDS = 3 * 86400

    def on_push(event, payload):
        raise RuntimeError("a bug on this event")

    webhook_handler(provider="github", event_types=["push"])(on_push)
    try:
        receive_github(client)
        raw_events_verify_batch()
        far = timezone.now() + timedelta(days=30)
        for attempt in (1, 2):
            deliveries_run_due(now=far)
            delivery = Delivery.objects.get()
            assert (delivery.status, delivery.attempts) == ("pending", attempt)
        # The second failure's pause reaches the horizon: 3 days after the first failure.
        assert delivery.first_failed_at is not None
        assert delivery.next_attempt_at >= delivery.first_failed_at + timedelta(days=3)
        # Claimed early anyway (a replay would do that; here: by hand), the third charged
        # failure before the horizon does not kill it.
        Delivery.objects.update(next_attempt_at=timezone.now())
        deliveries_run_due()
        delivery = Delivery.objects.get()
        assert (delivery.status, delivery.attempts) == ("pending", 3)
        # Past the horizon, the next charged failure does.
        Delivery.objects.update(
            next_attempt_at=timezone.now(), first_failed_at=timezone.now() - timedelta(days=3)
        )
        deliveries_run_due()
        assert Delivery.objects.get().status == "dead"
    finally:
        unregister(f"{on_push.__module__}.{on_push.__qualname__}")


def test_a_late_worker_cannot_overwrite_a_rearmed_and_reclaimed_delivery(
    client, push_handler, settings
):
    receive_github(client)
    raw_events_verify_batch()
    now = timezone.now()
    (old,) = _claim_due_deliveries(10, now)
    later = now + timedelta(seconds=settings.DELIVERY_STALE_AFTER_SECONDS + 1)
    assert deliveries_rearm_stale(now=later) == 1  # its worker was presumed dead…
    (new,) = _claim_due_deliveries(10, later)  # …and another one took it
    # …but the first worker comes back and records a permanent failure.
    late = PermanentHandlerError("late")
    _record_failure(_Failure(old, classify(late), "PermanentHandlerError: late", now))
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.claimed_at, delivery.attempts) == (
        "processing",
        later,
        new.attempts,
    )
    assert not DeliveryAttempt.objects.filter(outcome__in=["permanent", "dead"]).exists()
