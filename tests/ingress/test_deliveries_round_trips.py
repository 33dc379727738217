"""Round trips per delivery (issue 15, end to end): a batch of handlers that all return runs
without a savepoint per handler, and one that raises is still charged alone.

The delivery side is ~80 % of the inbox workers' time, and a SAVEPOINT + RELEASE around
every handler was two of its three round trips per delivery (docs/benchmarks.md). The
statements are counted with Django's CaptureQueriesContext over a real batch on PostgreSQL;
the per-delivery cost is the difference between two batch sizes, so the claim's and the
bookkeeping's fixed statements cancel out. Transactional tests: the rollback of the
optimistic pass and the savepoints of the rerun only happen for real when the batch commits.
"""

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from ingress.deliveries import deliveries_run_due
from ingress.handlers import unregister, webhook_handler
from ingress.inbox import raw_events_verify_batch
from ingress.models import Delivery, DeliveryAttempt, RawEvent
from tests.support.signing import store_signed_stripe_event, stripe_event

pytestmark = pytest.mark.django_db(transaction=True)

EVENT_TYPE = "test.round_trips.ordinary"
# What each handler call writes: committed once per delivery that is done, never for one
# that failed (its savepoint, or the optimistic pass, rolled back).
EFFECTS_TABLE = "test_round_trips_effect"


class Writer:
    """A registered handler writing one row per call (one statement: the handler's own)."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.fail_on: set[int] = set()
        self.failure = lambda: RuntimeError("this event fails")

        def on_round_trips_event(event, payload):
            self.calls.append(event.id)
            if event.id in self.fail_on:
                raise self.failure()
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {EFFECTS_TABLE} (raw_event_id) VALUES (%s)",  # noqa: S608
                    [event.id],
                )

        webhook_handler(provider="stripe", event_types=[EVENT_TYPE])(on_round_trips_event)
        self.name = f"{on_round_trips_event.__module__}.{on_round_trips_event.__qualname__}"


@pytest.fixture
def writer():
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {EFFECTS_TABLE} (raw_event_id bigint NOT NULL)")
    handler = Writer()
    yield handler
    unregister(handler.name)
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {EFFECTS_TABLE}")


def effects() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT raw_event_id FROM {EFFECTS_TABLE} ORDER BY raw_event_id")  # noqa: S608
        return [row[0] for row in cursor.fetchall()]


def settled_events(count: int, prefix: str) -> list[RawEvent]:
    events = [
        store_signed_stripe_event(stripe_event(f"evt_{prefix}_{n}", EVENT_TYPE))
        for n in range(count)
    ]
    assert raw_events_verify_batch() == count
    assert Delivery.objects.filter(status="pending").count() == count
    return events


def run_batch_counting() -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        deliveries_run_due()
    return [query["sql"] for query in captured.captured_queries]


def test_a_batch_of_returning_handlers_costs_one_statement_per_delivery(writer):
    runs = {}
    for size in (3, 12):
        events = settled_events(size, f"n{size}")
        statements = run_batch_counting()
        assert sorted(writer.calls) == [e.id for e in events]
        writer.calls.clear()
        runs[size] = statements
        assert set(Delivery.objects.values_list("status", flat=True)) == {"done"}

    for statements in runs.values():
        assert not [sql for sql in statements if "SAVEPOINT" in sql.upper()], statements
    # Per delivery: the handler's own INSERT and nothing else (it was 3 with a savepoint
    # per handler: SAVEPOINT, the handler's statement, RELEASE SAVEPOINT).
    per_delivery = (len(runs[12]) - len(runs[3])) / (12 - 3)
    assert per_delivery == 1, (runs[3], runs[12])
    # The handled stamp names the events' received_at range: the partition key, so the
    # UPDATE reads their day's partition only, not every day's (by id alone).
    (stamp,) = [sql for sql in runs[12] if '"handled_at" =' in sql and sql.startswith("UPDATE")]
    assert '"received_at" BETWEEN' in stamp, stamp
    assert len(effects()) == 15
    assert DeliveryAttempt.objects.filter(outcome="done").count() == 15
    assert RawEvent.objects.filter(handled_at__isnull=True).count() == 0


@pytest.mark.parametrize(
    ("failure", "failing_calls", "charged", "outcome"),
    [
        # Charged as it was raised in the optimistic pass: not called again for the attempt.
        pytest.param(
            lambda: RuntimeError("this event fails"), 1, 1, "transient", id="a bug in the handler"
        ),
        # Our database's error class, raised by a working connection: not taken for an
        # outage of the batch, run again in its savepoint (a database error may be an
        # earlier handler's aftermath), and then released alone — our database is never the
        # delivery's fault, so never charged (issue 27).
        pytest.param(
            lambda: OperationalError("canceling statement"),
            2,
            0,
            "released",
            id="an OperationalError",
        ),
    ],
)
def test_one_raising_handler_fails_alone_and_the_others_are_done_once(
    writer, failure, failing_calls, charged, outcome
):
    events = settled_events(6, "fail")
    failing = events[3]
    writer.fail_on = {failing.id}
    writer.failure = failure

    assert deliveries_run_due() == 6

    assert writer.calls.count(failing.id) == failing_calls
    ok_ids = [e.id for e in events if e.id != failing.id]
    assert effects() == ok_ids  # each done one's writes committed exactly once
    bad = Delivery.objects.get(raw_event_id=failing.id)
    assert (bad.status, bad.attempts, bad.total_attempts) == ("pending", charged, 1)
    assert bad.last_error.startswith(type(failure()).__name__ + ": ")
    assert list(DeliveryAttempt.objects.filter(delivery=bad).values_list("outcome", "error")) == [
        (outcome, bad.last_error)
    ]
    done = Delivery.objects.filter(raw_event_id__in=ok_ids)
    assert set(done.values_list("status", "attempts", "last_error")) == {("done", 1, "")}
    attempts = DeliveryAttempt.objects.filter(delivery__in=done)
    assert sorted(attempts.values_list("outcome", flat=True)) == ["done"] * 5
    handled = RawEvent.objects.filter(handled_at__isnull=False).values_list("id", flat=True)
    assert sorted(handled) == ok_ids
