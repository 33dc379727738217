"""A delivery whose worker dies: re-armed, never charged for the death (issue 27).

A worker that dies mid-delivery records nothing; the delivery stays `processing` until
deliveries_rearm_stale finds it. The dead worker is simulated exactly as it looks in the
database: the delivery is claimed by the real claim (which charges the attempt) and then
abandoned. A worker's death is no verdict about the delivery — a deploy's SIGKILL, the
out-of-memory killer and PostgreSQL restarting under the batch all look the same from here —
so the re-arm gives the attempt back and the delivery never dies of it. (A delivery proven
to kill its worker is issue 29's: counted at the re-arm, set aside after N.)
"""

from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone

from ingress.deliveries import _claim_due_deliveries, deliveries_rearm_stale, deliveries_run_due
from ingress.inbox import raw_events_verify_batch
from ingress.models import Delivery
from tests.ingress import test_inbox
from tests.ingress.test_inbox import receive_github
from tests.support.sql import database_dsn

pytestmark = pytest.mark.django_db

push_handler = test_inbox.push_handler  # the fixture: a registered `push` handler


@pytest.fixture
def stale_after(settings):
    settings.DELIVERY_MAX_ATTEMPTS = 3
    return timedelta(seconds=settings.DELIVERY_STALE_AFTER_SECONDS + 1)


def abandon_one_claim(now) -> None:
    """A worker claims the due delivery, then dies: nothing else is written."""
    assert len(_claim_due_deliveries(10, now)) == 1


def test_a_delivery_whose_worker_keeps_dying_is_rearmed_uncharged_and_never_dies(
    client, push_handler, stale_after
):
    event = receive_github(client)
    raw_events_verify_batch()
    now = timezone.now()
    for _ in range(5):  # more deaths than DELIVERY_MAX_ATTEMPTS
        abandon_one_claim(now)
        now += stale_after
        assert deliveries_rearm_stale(now=now) == 1
        delivery = Delivery.objects.get()
        assert (delivery.status, delivery.attempts) == ("pending", 0)
    assert deliveries_run_due(now=now) == 1
    delivery = Delivery.objects.get()
    # Done on its first charged attempt; total_attempts still counts every claim.
    assert (delivery.status, delivery.attempts, delivery.total_attempts) == ("done", 1, 6)
    assert list(delivery.history.values_list("number", "outcome")) == [(6, "done")]
    event.refresh_from_db()
    assert event.handled_at is not None


def test_recorded_failures_count_and_deaths_do_not(client, push_handler, stale_after):
    receive_github(client)
    raw_events_verify_batch()
    push_handler.fail_with = RuntimeError("flaky")
    assert deliveries_run_due() == 1  # attempt 1: recorded, transient, charged
    now = Delivery.objects.get().next_attempt_at
    for _ in range(2):  # then the worker dies twice
        abandon_one_claim(now)
        now += stale_after
        deliveries_rearm_stale(now=now)
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert list(delivery.history.values_list("number", "outcome")) == [(1, "transient")]


@pytest.mark.django_db(transaction=True)
def test_a_live_batch_holding_its_claims_is_never_rearmed(client, push_handler, stale_after):
    """A batch locks its claims for its whole run (the fence); the re-arm skips locked rows,
    so a batch that outlives the stale threshold — or a frozen worker whose connection
    lives on — is not run a second time under it."""
    receive_github(client)
    raw_events_verify_batch()
    now = timezone.now()
    abandon_one_claim(now)
    with psycopg.connect(database_dsn()) as batch:  # another worker's batch, still running
        batch.execute("SELECT 1 FROM ingress_delivery FOR UPDATE")
        assert deliveries_rearm_stale(now=now + stale_after) == 0
        batch.rollback()
    assert Delivery.objects.get().status == "processing"
    assert deliveries_rearm_stale(now=now + stale_after) == 1
