"""The worker's pass runs a fresh event's deliveries in the transaction that settled it
(issue 15, end to end).

An event whose handlers are all unordered, unpaused and not resting after a failure needs no
claim: its deliveries are inserted `done` with their attempt and the event stamped handled,
all with its verdict — no `pending` → `processing` → `done` round of the delivery row, no
read-back of the event (ingress/deliveries/create.py, "run at settle"). Whatever a handler does
wrong there (raise, or write what only fails at COMMIT) ends as it did before: the claim
runs, charges and retries it, and every write is committed once. Transactional tests: the
savepoint's rollback and the COMMIT-time failure only happen for real when the batch commits.
"""

import re

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ingress.deliveries import deliveries_run_due
from ingress.deliveries.create import SettleRunCooldown, settle_run_cooldown
from ingress.deliveries.statements import SETTLE_RUN_INSERT
from ingress.handlers import unregister, webhook_handler
from ingress.inbox import inbox_run_once
from ingress.models import Delivery, DeliveryAttempt, HandlerPause, RawEvent
from kernel.queue import this_process
from tests.support.signing import store_signed_stripe_event, stripe_event

pytestmark = pytest.mark.django_db(transaction=True)

EVENT_TYPE = "test.settle_run.ordinary"
EFFECTS_TABLE = "test_settle_run_effect"


class Writer:
    """A registered handler writing one row per call; `fail_on` raises, `dangle_on` writes a
    row whose foreign key fails only at COMMIT (Django's are deferred)."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.fail_on: set[int] = set()
        self.dangle_on: set[int] = set()
        self.lose_connection_on: set[int] = set()

        def on_settle_run_event(event, payload):
            self.calls.append(event.id)
            if event.id in self.fail_on:
                raise RuntimeError("this event fails")
            if event.id in self.lose_connection_on:
                connection.connection.close()  # the server went away under the handler
                raise OperationalError("server closed the connection unexpectedly")
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {EFFECTS_TABLE} (raw_event_id) VALUES (%s)",  # noqa: S608
                    [event.id],
                )
            if event.id in self.dangle_on:
                now = timezone.now()
                DeliveryAttempt.objects.create(
                    delivery_id=10**12, number=1, started_at=now, finished_at=now, outcome="done"
                )

        webhook_handler(provider="stripe", event_types=[EVENT_TYPE])(on_settle_run_event)
        self.name = f"{on_settle_run_event.__module__}.{on_settle_run_event.__qualname__}"


@pytest.fixture
def writer():
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {EFFECTS_TABLE} (raw_event_id bigint NOT NULL)")
    handler = Writer()
    yield handler
    unregister(handler.name)
    # The rest after a failure is per process: not carried into the next test.
    this_process().memo["deliveries.settle_run"] = SettleRunCooldown()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {EFFECTS_TABLE}")


def effects() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT raw_event_id FROM {EFFECTS_TABLE} ORDER BY raw_event_id")  # noqa: S608
        return [row[0] for row in cursor.fetchall()]


def stored(count: int, prefix: str) -> list[RawEvent]:
    return [
        store_signed_stripe_event(stripe_event(f"evt_{prefix}_{n}", EVENT_TYPE))
        for n in range(count)
    ]


_DELIVERY_WRITE = re.compile(
    r'UPDATE "ingress_delivery"(?: AS [dt])? SET "?status"? = \'(?:processing|done)\''
)


def delivery_writes(statements: list[str]) -> list[str]:
    """The claim's UPDATE to `processing` and the batch's to `done`."""
    return [sql for sql in statements if _DELIVERY_WRITE.search(sql)]


def test_a_fresh_event_is_delivered_with_its_verdict_without_a_claim(writer):
    events = stored(4, "fresh")
    with CaptureQueriesContext(connection) as captured:
        result = inbox_run_once()
    statements = [query["sql"] for query in captured.captured_queries]

    assert (result.verified, result.delivered) == (4, 4)
    # Never claimed (`processing`) nor marked done afterwards: inserted done. The one write
    # is the pass's claim statement, which found nothing due (total_attempts stays 1).
    (claim,) = delivery_writes(statements)
    assert "SKIP LOCKED" in claim, statements
    assert sorted(writer.calls) == effects() == sorted(e.id for e in events)
    rows = Delivery.objects.filter(raw_event_id__in=[e.id for e in events])
    assert {(d.status, d.attempts, d.total_attempts, d.last_error) for d in rows} == {
        ("done", 1, 1, "")
    }
    for delivery in rows:
        [attempt] = DeliveryAttempt.objects.filter(delivery=delivery)
        assert (attempt.number, attempt.outcome) == (1, "done")
        assert delivery.claimed_at is not None and delivery.finished_at is not None
        assert delivery.claimed_at <= attempt.started_at <= attempt.finished_at
        assert attempt.finished_at <= delivery.finished_at
        event = RawEvent.objects.get(id=delivery.raw_event_id)
        assert (event.signature_status, event.dispatch_status) == ("verified", "dispatched")
        assert event.handled_at == delivery.finished_at
    # Nothing left for the claim.
    assert deliveries_run_due() == 0


def test_a_raising_handler_leaves_the_batch_to_the_claim_which_charges_it_alone(writer):
    events = stored(5, "raise")
    failing = events[2]
    writer.fail_on = {failing.id}

    result = inbox_run_once()

    assert (result.verified, result.delivered) == (5, 5)
    ok_ids = sorted(e.id for e in events if e.id != failing.id)
    assert effects() == ok_ids  # the run at settle was rolled back: committed once, by the claim
    bad = Delivery.objects.get(raw_event_id=failing.id)
    assert (bad.status, bad.attempts, bad.total_attempts) == ("pending", 1, 1)
    assert bad.last_error == "RuntimeError: this event fails"
    assert list(DeliveryAttempt.objects.filter(delivery=bad).values_list("outcome")) == [
        ("transient",)
    ]
    for delivery in Delivery.objects.filter(raw_event_id__in=ok_ids):
        assert (delivery.status, delivery.attempts) == ("done", 1)
        assert DeliveryAttempt.objects.filter(delivery=delivery).count() == 1
    assert RawEvent.objects.get(id=failing.id).handled_at is None
    assert RawEvent.objects.filter(id__in=ok_ids, handled_at__isnull=True).count() == 0

    # The handler that raised rests from running at settle: the next event goes by the claim.
    writer.calls.clear()
    [later] = stored(1, "after")
    with CaptureQueriesContext(connection) as captured:
        inbox_run_once()
    claims = delivery_writes([query["sql"] for query in captured.captured_queries])
    assert len(claims) == 2, claims
    assert writer.calls.count(later.id) == 1
    assert Delivery.objects.get(raw_event_id=later.id).status == "done"


def test_a_write_failing_at_commit_settles_the_batch_again_for_the_claim(writer):
    events = stored(3, "dangle")
    dangling = events[1]
    writer.dangle_on = {dangling.id}

    result = inbox_run_once()  # does not raise: the worker loop would back off for seconds

    assert result.verified == 3
    assert set(RawEvent.objects.values_list("signature_status", flat=True)) == {"verified"}
    ok_ids = sorted(e.id for e in events if e.id != dangling.id)
    assert effects() == ok_ids
    bad = Delivery.objects.get(raw_event_id=dangling.id)
    # A database error (checked at COMMIT): never charged to the delivery (issue 27).
    assert (bad.status, bad.attempts) == ("pending", 0)
    assert bad.last_error.startswith("IntegrityError"), bad.last_error
    assert set(
        Delivery.objects.filter(raw_event_id__in=ok_ids).values_list("status", "attempts")
    ) == {("done", 1)}
    assert not DeliveryAttempt.objects.filter(delivery_id=10**12).exists()


def test_a_lost_connection_at_settle_propagates_and_leaves_the_events_pending(writer):
    events = stored(3, "lost")
    writer.lose_connection_on = {events[1].id}

    with pytest.raises(OperationalError):  # the worker loop backs off, as for any outage
        inbox_run_once()
    # Taken for what it is, an outage: not for a COMMIT-time failure that rests settle runs.
    assert settle_run_cooldown().everything_until == 0.0

    connection.close()
    assert set(RawEvent.objects.values_list("signature_status", flat=True)) == {"pending"}
    assert not Delivery.objects.exists() and effects() == []
    writer.lose_connection_on = set()
    assert inbox_run_once().delivered == 3


def test_a_paused_handler_is_not_run_at_settle(writer):
    HandlerPause.objects.create(handler=writer.name)
    [event] = stored(1, "paused")

    inbox_run_once()

    assert writer.calls == [] and effects() == []
    assert Delivery.objects.get(raw_event_id=event.id).status == "held"
    assert RawEvent.objects.get(id=event.id).handled_at is None


def test_the_settle_insert_names_every_column_of_a_delivery():
    named = SETTLE_RUN_INSERT.split("INSERT INTO {table} (", 1)[1].split(")", 1)[0]
    columns = {column.strip() for column in named.split(",")}
    model = {f.column for f in Delivery._meta.concrete_fields if not f.primary_key}
    assert columns == model
