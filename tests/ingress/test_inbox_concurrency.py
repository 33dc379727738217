"""Several workers at once on PostgreSQL: SKIP LOCKED claims and the dedup unique index.

Real threads, each with its own database connection, against a real backlog.
"""

import threading
import time
from collections import Counter

import pytest
from django.db import connection

from ingress.deliveries import deliveries_run_due
from ingress.handlers import unregister, webhook_handler
from ingress.inbox import inbox_run_once, raw_events_verify_batch
from ingress.models import Delivery, RawEvent
from tests.support.signing import store_signed_stripe_event, stripe_event

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def counting_handler():
    calls: Counter[int] = Counter()
    lock = threading.Lock()

    def on_test_event(event, payload):
        with lock:
            calls[event.id] += 1

    webhook_handler(provider="stripe", event_types=["test.concurrency"])(on_test_event)
    yield calls
    unregister(f"{on_test_event.__module__}.{on_test_event.__qualname__}")


def store_stripe(event_id: str, *, timestamp: int | None = None) -> RawEvent:
    return store_signed_stripe_event(
        stripe_event(event_id, "test.concurrency"), timestamp=timestamp
    )


def run_workers(count: int, work, deadline_seconds: float = 60.0) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def worker():
        try:
            start.wait()
            stop_at = time.monotonic() + deadline_seconds
            while time.monotonic() < stop_at and work():
                pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(deadline_seconds + 10)
    return errors


def test_parallel_workers_over_a_backlog_never_handle_an_event_twice(counting_handler):
    events = [store_stripe(f"evt_{n}") for n in range(400)]
    errors = run_workers(4, lambda: not inbox_run_once(limit=25).idle)
    assert errors == []
    assert set(counting_handler) == {event.id for event in events}
    assert max(counting_handler.values()) == 1
    assert Delivery.objects.filter(status="done").count() == 400
    assert not RawEvent.objects.filter(signature_status="pending").exists()


def test_ten_concurrent_copies_of_one_stripe_event_give_one_delivery(counting_handler):
    # Stripe redelivers with a new timestamp, so each copy has its own signature header.
    base = int(time.time())
    copies = [store_stripe("evt_same", timestamp=base + n) for n in range(10)]
    errors = run_workers(10, lambda: raw_events_verify_batch(limit=1) > 0)
    assert errors == []
    assert Delivery.objects.count() == 1
    statuses = Counter(RawEvent.objects.values_list("dispatch_status", flat=True))
    assert statuses == {"dispatched": 1, "duplicate": 9}
    winner = RawEvent.objects.get(dispatch_status="dispatched")
    assert set(
        RawEvent.objects.filter(dispatch_status="duplicate").values_list(
            "duplicate_of_id", flat=True
        )
    ) == {winner.id}
    run_workers(3, lambda: deliveries_run_due() > 0)
    assert sum(counting_handler.values()) == 1
    assert {c.id for c in copies} >= set(counting_handler)
