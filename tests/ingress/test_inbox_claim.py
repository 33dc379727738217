"""The inbox's claim of raw events (issue 29): by rows and by bytes, marked so that a row
that kills its worker is counted before it can kill the next one.

In-process on PostgreSQL, with the worker's death simulated as it looks in the database: a
batch claimed by the real claim (`raw_events_claim`, committed) and never settled. The
real processes killing themselves, and the memory bound under a flood of 1 MiB junk:
tests/ingress/test_inbox_worker_deaths.py.
"""

from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from ingress import inbox
from ingress.checks import check_inbox_claim
from ingress.deliveries import deliveries_run_due
from ingress.inbox import inbox_run_once, raw_events_claim, raw_events_verify_batch
from ingress.models import Delivery, RawEvent, RawEventClaim
from ingress.services import raw_event_reverify
from kernel.queue import WorkQuerySet, this_process
from tests.ingress import test_inbox
from tests.ingress.test_inbox import receive_github

pytestmark = pytest.mark.django_db

push_handler = test_inbox.push_handler  # the fixture: a registered `push` handler


@pytest.fixture
def deaths(settings):
    settings.INBOX_MAX_WORKER_DEATHS = 3
    settings.INBOX_CLAIM_LEASE_SECONDS = 60.0
    return timedelta(seconds=61)  # past the lease


def receive(client, count: int, *, padding: int = 0) -> list[RawEvent]:
    return [
        receive_github(
            client,
            {"ref": "refs/heads/main", "delivery": f"d-{n}", "pad": "x" * padding},
            delivery=f"d-{n}",
        )
        for n in range(count)
    ]


def claims() -> dict[int, tuple[str, int]]:
    """Each claim row: raw event id -> (status, worker deaths)."""
    rows = RawEventClaim.objects.all()
    return {row.raw_event_id: (row.status, row.worker_deaths) for row in rows}


def pending_ids() -> list[int]:
    return list(
        RawEvent.objects.filter(signature_status="pending")
        .order_by("id")
        .values_list("id", flat=True)
    )


def test_a_claim_stops_at_the_byte_budget_and_takes_one_row_at_least(client, settings):
    events = receive(client, 5, padding=1000)
    body = len(bytes(events[0].body))
    settings.INBOX_BATCH_BYTES = 2 * body + body // 2
    assert [raw_events_verify_batch() for _ in range(4)] == [2, 2, 1, 0]
    receive(client, 3, padding=2000)
    settings.INBOX_BATCH_BYTES = 1  # below any body: one row per claim
    assert [raw_events_verify_batch() for _ in range(4)] == [1, 1, 1, 0]


def test_a_row_that_kills_its_worker_is_claimed_alone_then_set_aside(client, push_handler, deaths):
    before, poison, after = receive(client, 3)
    now = timezone.now()
    raw_events_claim(limit=500, now=now)  # the worker dies settling the batch

    assert raw_events_verify_batch(now=now) == 0  # its rows wait out the claim's lease
    now += deaths
    # Every row of the dead batch is a suspect now: claimed alone, one per claim.
    assert raw_events_verify_batch(now=now) == 1
    assert pending_ids() == [poison.id, after.id]
    for _ in range(2):  # the poison row kills the worker twice more, alone
        claim = raw_events_claim(limit=500, now=now)
        assert claim is not None and claim.ids == (poison.id,)
        now += deaths
    assert raw_events_verify_batch(now=now) == 1  # found with three deaths: set aside
    poison.refresh_from_db()
    assert (poison.signature_status, poison.rejection_reason) == ("rejected", "worker_died")
    assert poison.dispatch_status == "not_dispatched"
    assert claims() == {after.id: ("pending", 1)}  # the row behind it: due again, one death
    assert poison.processing_error.startswith("worker_died: its worker died 3 times in a row")
    assert poison.processing_failures == 0  # deaths are no charged failures
    assert raw_events_verify_batch(now=now) == 1
    assert pending_ids() == []
    assert deliveries_run_due(now=now) == 2
    assert sorted(call[0] for call in push_handler.calls) == [before.id, after.id]

    # Re-verify hands it back to the worker, as a suspect, never settles it in the caller.
    event = raw_event_reverify(raw_event=poison)
    assert event.signature_status == "pending"
    assert claims()[poison.id] == ("pending", 1)  # a suspect: claimed alone
    assert push_handler.calls and poison.id not in [call[0] for call in push_handler.calls]
    inbox_run_once()
    poison.refresh_from_db()
    assert poison.signature_status == "verified"
    assert poison.id not in claims()  # settled: its claim deleted with it
    assert Delivery.objects.get(raw_event_id=poison.id).status == "done"


def test_a_suspect_is_settled_without_running_handlers_at_settle(
    client, push_handler, deaths, monkeypatch
):
    """A handler that kills the worker at settle must be counted on its delivery, not on its
    event: a suspect's handlers run from the deliveries' claim."""
    (event,) = receive(client, 1)
    now = timezone.now()
    raw_events_claim(limit=500, now=now)  # a death
    ran_at_settle = []
    monkeypatch.setattr(
        inbox, "deliveries_run_at_settle", lambda runnable, now: ran_at_settle.append(runnable)
    )
    assert raw_events_verify_batch(now=now + deaths) == 1
    assert ran_at_settle == []
    delivery = Delivery.objects.get(raw_event_id=event.id)
    assert (delivery.status, delivery.attempts) == ("pending", 0)


def test_a_batch_our_database_fails_under_is_given_back_not_counted(
    client, push_handler, deaths, monkeypatch
):
    events = receive(client, 3)

    def database_gone(events, now, *, run_handlers=False):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(inbox, "raw_events_settle", database_gone)
    with pytest.raises(OperationalError):
        inbox_run_once()
    for event in events:
        event.refresh_from_db()
        assert event.signature_status == "pending"
    assert claims() == {event.id: ("pending", 0) for event in events}  # given back
    monkeypatch.undo()
    assert inbox_run_once().verified == 3  # due at once, in one batch: no suspects
    assert len(push_handler.calls) == 3


def test_a_give_back_the_database_refuses_is_owed_until_the_next_pass(
    client, push_handler, deaths, monkeypatch
):
    events = receive(client, 3)

    def database_gone(*args, **kwargs):
        raise OperationalError("the database system is shutting down")

    monkeypatch.setattr(inbox, "raw_events_settle", database_gone)
    monkeypatch.setattr(WorkQuerySet, "give_back", database_gone)
    with pytest.raises(OperationalError):
        inbox_run_once()
    assert {claim[0] for claim in claims().values()} == {"processing"}  # still claimed
    assert len(this_process().owed[RawEventClaim._meta.label]) == 3  # owed, in this process
    monkeypatch.undo()
    assert inbox_run_once().verified == 3  # given back first: one batch, no suspects
    assert this_process().owed[RawEventClaim._meta.label] == []
    assert claims() == {} and {e.id for e in events} == set(
        RawEvent.objects.filter(signature_status="verified").values_list("id", flat=True)
    )

def test_a_claim_taken_over_after_its_lease_is_fenced_out(client, push_handler, deaths):
    """A worker frozen past the lease: another one claims the rows again; the first one's
    settling finds none of them its own and writes nothing."""
    receive(client, 2)
    now = timezone.now()
    frozen = raw_events_claim(limit=500, now=now)
    assert frozen is not None
    for _ in range(2):  # the other worker, each row alone (a suspect)
        assert raw_events_verify_batch(now=now + deaths) == 1
    assert deliveries_run_due(now=now + deaths) == 2
    assert inbox._settle_claim(frozen, now, run_handlers=True) == 0
    assert RawEvent.objects.filter(signature_status="verified").count() == 2
    assert len(push_handler.calls) == 2


def test_the_claim_settings_are_checked(settings):
    settings.INBOX_BATCH_BYTES = 0
    settings.INBOX_MAX_WORKER_DEATHS = 1
    settings.INBOX_CLAIM_LEASE_SECONDS = 0
    errors = [message for message in check_inbox_claim() if message.id == "ingress.E012"]
    assert len(errors) == 3
    settings.INBOX_BATCH_BYTES = 1000
    settings.INBOX_MAX_WORKER_DEATHS = 3
    settings.INBOX_CLAIM_LEASE_SECONDS = 5
    warnings = [message.msg for message in check_inbox_claim() if message.id == "ingress.W012"]
    assert len(warnings) == 2
    assert "max_body_bytes (1048576)" in warnings[0]
    assert "error backoff (30 s)" in warnings[1]
    settings.INBOX_BATCH_BYTES = 32 * 1024 * 1024
    settings.INBOX_CLAIM_LEASE_SECONDS = 60
    assert check_inbox_claim() == []
