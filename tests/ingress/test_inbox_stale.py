"""A delivery whose worker dies: re-armed, never charged an attempt for the death, and set
aside `worker_died` once its worker has died INBOX_MAX_WORKER_DEATHS times in a row with it
(issues 27 and 29).

A worker that dies mid-delivery records nothing; the delivery stays `processing` until
deliveries_rearm_orphaned finds it. The dead worker is simulated exactly as it looks in the
database: the delivery is claimed by the real claim (which charges the attempt) and then
abandoned. A worker that lives gives back what it could not finish (a database failure
under its batch), so the re-arm counts what it finds as a death — and gives the attempt
back: a death is no charged attempt. A delivery with deaths is claimed alone. The real
processes killing themselves: tests/ingress/test_inbox_worker_deaths.py.
"""

from datetime import timedelta

import psycopg
import pytest
from django.db import OperationalError
from django.utils import timezone

from ingress.deliveries import deliveries_claim, deliveries_rearm_orphaned, deliveries_run_due, run
from ingress.inbox import raw_events_verify_batch
from ingress.models import Delivery
from ingress.services import deliveries_rearm_batch
from kernel.queue import WorkQuerySet, this_process
from tests.ingress import test_inbox
from tests.ingress.test_inbox import receive_github
from tests.support.sql import database_dsn

pytestmark = pytest.mark.django_db

push_handler = test_inbox.push_handler  # the fixture: a registered `push` handler


@pytest.fixture
def stale_after(settings):
    settings.DELIVERY_MAX_ATTEMPTS = 3
    settings.INBOX_MAX_WORKER_DEATHS = 3
    return timedelta(seconds=settings.DELIVERY_STALE_AFTER_SECONDS + 1)


def abandon_one_claim(now) -> None:
    """A worker claims the due delivery, then dies: nothing else is written."""
    assert len(deliveries_claim(limit=10, now=now)) == 1


def test_a_delivery_whose_worker_keeps_dying_is_set_aside_uncharged(
    client, push_handler, stale_after
):
    event = receive_github(client)
    raw_events_verify_batch()
    now = timezone.now()
    for deaths in (1, 2):
        abandon_one_claim(now)
        now += stale_after
        assert deliveries_rearm_orphaned(now=now) == 1
        delivery = Delivery.objects.get()
        assert (delivery.status, delivery.attempts, delivery.worker_deaths) == (
            "pending",
            0,
            deaths,
        )
    abandon_one_claim(now)
    now += stale_after
    assert deliveries_rearm_orphaned(now=now) == 1
    delivery = Delivery.objects.get()
    # The third death in a row: dead, visibly, with the reason — and still no attempt charged.
    assert (delivery.status, delivery.attempts, delivery.worker_deaths) == ("dead", 0, 3)
    assert delivery.last_error.startswith("worker_died: its worker died 3 times in a row")
    assert list(delivery.history.values_list("number", "outcome")) == [(3, "dead")]
    event.refresh_from_db()
    assert event.handled_at is not None  # finished, as any dead delivery
    assert deliveries_run_due(now=now) == 0  # never claimed again …

    assert deliveries_rearm_batch(delivery_ids=[delivery.id]).rearmed == 1  # … unless re-armed
    assert deliveries_run_due(now=now) == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.worker_deaths) == ("done", 1, 0)
    assert push_handler.calls


def test_recorded_failures_count_and_deaths_do_not(client, push_handler, stale_after):
    receive_github(client)
    raw_events_verify_batch()
    push_handler.fail_with = RuntimeError("flaky")
    assert deliveries_run_due() == 1  # attempt 1: recorded, transient, charged
    now = Delivery.objects.get().next_attempt_at
    for _ in range(2):  # then the worker dies twice
        abandon_one_claim(now)
        now += stale_after
        deliveries_rearm_orphaned(now=now)
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.worker_deaths) == ("pending", 1, 2)
    assert list(delivery.history.values_list("number", "outcome")) == [(1, "transient")]
    # A recorded outcome ends the run of deaths: the worker lived through the delivery.
    assert deliveries_run_due(now=now) == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.worker_deaths) == ("pending", 2, 0)


def test_a_delivery_with_deaths_is_claimed_alone(client, push_handler, stale_after):
    for n in range(4):
        receive_github(client, delivery=f"d-{n}")
    raw_events_verify_batch()
    first, suspect, *rest = Delivery.objects.order_by("id")
    now = timezone.now()
    for n, delivery in enumerate(Delivery.objects.order_by("id")):
        delivery.next_attempt_at = now - timedelta(seconds=10 - n)
        delivery.save(update_fields=["next_attempt_at"])
    Delivery.objects.filter(id=suspect.id).update(worker_deaths=1)

    # Oldest first: the claim stops before the suspect, then takes it alone, then the rest.
    claims = [[item.id for item in deliveries_claim(limit=10, now=now)] for _ in range(3)]
    assert claims == [[first.id], [suspect.id], [delivery.id for delivery in rest]]


def test_a_batch_our_database_fails_under_is_given_back_not_counted(
    client, push_handler, stale_after, monkeypatch
):
    """A worker that lives gives back what it could not finish: `pending` again at once, the
    attempt given back, no death counted — a database restart under a batch is no evidence."""
    receive_github(client)
    raw_events_verify_batch()

    def database_gone(claimed, events):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(run, "_run_claimed", database_gone)
    with pytest.raises(OperationalError):
        deliveries_run_due()
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.claimed_at) == ("pending", 0, None)
    monkeypatch.undo()
    assert deliveries_rearm_orphaned(now=timezone.now() + stale_after) == 0
    assert deliveries_run_due() == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.worker_deaths) == ("done", 1, 0)


def test_a_give_back_the_database_refuses_is_owed_until_the_next_pass(
    client, push_handler, stale_after, monkeypatch
):
    receive_github(client)
    raw_events_verify_batch()

    def database_gone(*args, **kwargs):
        raise OperationalError("the database system is shutting down")

    monkeypatch.setattr(run, "_run_claimed", database_gone)
    monkeypatch.setattr(WorkQuerySet, "give_back", database_gone)  # the statement refused
    with pytest.raises(OperationalError):
        deliveries_run_due()
    assert Delivery.objects.get().status == "processing"  # owed, in this process
    monkeypatch.undo()
    assert deliveries_run_due() == 1  # gives it back first, then claims and runs it
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.worker_deaths) == ("done", 1, 0)
    assert this_process().owed.get("ingress.Delivery") == []


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
        assert deliveries_rearm_orphaned(now=now + stale_after) == 0
        batch.rollback()
    assert Delivery.objects.get().status == "processing"
    assert deliveries_rearm_orphaned(now=now + stale_after) == 1
