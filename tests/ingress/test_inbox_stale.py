"""Every state has a way out (issue 8 follow-up): a delivery whose worker keeps dying.

A worker that dies mid-delivery records nothing; the delivery stays `processing` until
deliveries_rearm_stale finds it. The dead worker is simulated exactly as it looks in the
database: the delivery is claimed by the real claim (which charges the attempt) and then
abandoned. On PostgreSQL, because the claim and the give-up lock with SKIP LOCKED.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from ingress.deliveries import _claim_due_deliveries, deliveries_rearm_stale, deliveries_run_due
from ingress.inbox import raw_events_verify_batch
from ingress.models import Delivery, DeliveryAttempt, RawEvent
from ingress.services import raw_event_replay
from tests.ingress import test_inbox
from tests.ingress.test_inbox import receive_github

pytestmark = pytest.mark.django_db

push_handler = test_inbox.push_handler  # the fixture: a registered `push` handler


@pytest.fixture
def stale_after(settings):
    settings.DELIVERY_MAX_ATTEMPTS = 3
    return timedelta(seconds=settings.DELIVERY_STALE_AFTER_SECONDS + 1)


def abandon_one_claim(now) -> None:
    """A worker claims the due delivery, then dies: nothing else is written."""
    assert len(_claim_due_deliveries(10, now)) == 1


def test_delivery_whose_worker_keeps_dying_goes_dead_visibly(client, push_handler, stale_after):
    event = receive_github(client)
    raw_events_verify_batch()
    now = timezone.now()
    for _ in range(3):
        abandon_one_claim(now)
        now += stale_after
        assert deliveries_rearm_stale(now=now) == 1
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("dead", 3)
    assert delivery.last_error == (
        "given up when re-armed as stale after 3 of 3 attempts: the worker died 3 times "
        "during this delivery, without recording an outcome"
    )
    last = DeliveryAttempt.objects.get(delivery=delivery)
    assert (last.number, last.outcome, last.error) == (3, "dead", delivery.last_error)
    event.refresh_from_db()
    assert event.handled_at is not None  # finished (dead): the event no longer waits
    # Nothing claims it again.
    assert deliveries_rearm_stale(now=now + stale_after) == 0
    assert _claim_due_deliveries(10, now + stale_after) == []
    assert push_handler.calls == []


def test_below_the_limit_an_abandoned_delivery_is_rearmed_and_runs(
    client, push_handler, stale_after
):
    receive_github(client)
    raw_events_verify_batch()
    now = timezone.now()
    for _ in range(2):
        abandon_one_claim(now)
        now += stale_after
        assert deliveries_rearm_stale(now=now) == 1
        assert Delivery.objects.get().status == "pending"
    assert deliveries_run_due(now=now) == 1
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("done", 3)


def test_recorded_failures_and_deaths_are_counted_apart(client, push_handler, stale_after):
    receive_github(client)
    raw_events_verify_batch()
    push_handler.fail_with = RuntimeError("flaky")
    assert deliveries_run_due() == 1  # attempt 1: recorded, transient
    now = Delivery.objects.get().next_attempt_at
    for _ in range(2):  # attempts 2 and 3: the worker dies
        abandon_one_claim(now)
        now += stale_after
        deliveries_rearm_stale(now=now)
    delivery = Delivery.objects.get()
    assert delivery.status == "dead"
    assert "the worker died 2 times" in delivery.last_error
    assert list(delivery.history.values_list("number", "outcome")) == [
        (1, "transient"),
        (3, "dead"),
    ]


def test_replay_of_a_given_up_delivery_gets_fresh_attempts(client, push_handler, stale_after):
    event = receive_github(client)
    raw_events_verify_batch()
    now = timezone.now()
    for _ in range(3):
        abandon_one_claim(now)
        now += stale_after
        deliveries_rearm_stale(now=now)
    assert raw_event_replay(raw_event=RawEvent.objects.get(pk=event.pk)) == 1
    assert deliveries_run_due() == 1
    assert Delivery.objects.get().status == "done"
