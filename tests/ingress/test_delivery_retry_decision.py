"""Deliveries on the project's one retry decision (kernel/retry.py, issue 9).

The inbox and the outbox used to be two retry state machines with different rules. Now both
classify a failure with `kernel.retry.classify` (one table: our database's errors are
transient, PermanentHandlerError and an unparseable body permanent) and record the
`RetryStrategy` decision fenced on (claimed_at, attempts).
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ingress.deliveries import deliveries_claim, deliveries_rearm_orphaned, deliveries_run_due
from ingress.deliveries.run import HandlerFailure, record_failure
from ingress.handlers import PermanentHandlerError, unregister, webhook_handler
from ingress.inbox import raw_events_verify_batch
from ingress.models import Delivery, DeliveryAttempt
from kernel.retry import classify
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
    (old,) = deliveries_claim(limit=10, now=now)
    later = now + timedelta(seconds=settings.DELIVERY_STALE_AFTER_SECONDS + 1)
    assert deliveries_rearm_orphaned(now=later) == 1  # its worker was presumed dead…
    (new,) = deliveries_claim(limit=10, now=later)  # …and another one took it
    # …but the first worker comes back and records a permanent failure.
    late = PermanentHandlerError("late")
    record_failure(HandlerFailure(old, classify(late), "PermanentHandlerError: late", now))
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.claimed_at, delivery.attempts) == (
        "processing",
        later,
        new.attempts,
    )
    assert not DeliveryAttempt.objects.filter(outcome__in=["permanent", "dead"]).exists()


# --- manage.py check: the deliveries' arithmetic, and the stale threshold against a batch ---


def test_check_reports_the_delivery_horizon_next_to_the_attempts(settings):
    from ingress.checks import check_delivery_retries
    from ingress.deliveries import delivery_retry_strategy
    from kernel.budgets import give_up_arithmetic

    assert check_delivery_retries() == []  # the defaults fit
    give_up = give_up_arithmetic(
        delivery_retry_strategy(),
        attempts_setting="DELIVERY_MAX_ATTEMPTS",
        horizon_setting="DELIVERY_TRANSIENT_HORIZON_SECONDS",
    )
    assert give_up.arithmetic.startswith(
        "dead after 8 charged attempts (DELIVERY_MAX_ATTEMPTS) with pauses of at most "
        "5.0+10.0+20.0+40.0+80.0+160.0+320.0 s = 635.0 s between them, the last attempt no "
        "earlier than the horizon, 259200.0 s (72.0 h, DELIVERY_TRANSIENT_HORIZON_SECONDS)"
    )
    settings.DELIVERY_TRANSIENT_HORIZON_SECONDS = 60
    (warning,) = check_delivery_retries()
    assert warning.id == "ingress.W010" and "635.0 s between them" in warning.msg
    settings.DELIVERY_TRANSIENT_HORIZON_SECONDS = -1
    (error,) = check_delivery_retries()
    assert error.id == "ingress.E010" and "invalid retry horizon" in error.msg


def test_check_holds_the_stale_threshold_against_the_batch_times_the_statement_cap(settings):
    from ingress.checks import check_delivery_retries

    settings.DELIVERY_STALE_AFTER_SECONDS = 600  # the old default
    (warning,) = check_delivery_retries()
    assert warning.id == "ingress.W011"
    assert warning.msg.startswith(
        "DELIVERY_STALE_AFTER_SECONDS (600 s) does not exceed the longest a claimed batch may "
        "run, 500 deliveries (INBOX_BATCH_SIZE) x statement 15.0 s = 7500.0 s"
    )
    settings.INBOX_BATCH_SIZE = 20  # 20 x 15 s = 300 s: fits
    assert check_delivery_retries() == []
