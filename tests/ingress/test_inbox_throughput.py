"""The verify side's round trips (issue 15): a batch is settled with a fixed set of statements,
whatever its size — no statement per row — and dedup asks who won a key only for the keys
its INSERT did not win. (How fast that drains: bench/inbox_throughput.py, not a test.)"""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ingress.handlers import unregister, webhook_handler
from ingress.inbox import raw_events_verify_batch
from ingress.models import DedupKey, Delivery, RawEvent
from tests.support.signing import store_signed_stripe_event, stripe_event

pytestmark = pytest.mark.django_db

EVENT_TYPE = "test.throughput"


@pytest.fixture
def two_handlers():
    def first_handler(event, payload):
        pass

    def second_handler(event, payload):
        pass

    names = []
    for func in (first_handler, second_handler):
        webhook_handler(provider="stripe", event_types=[EVENT_TYPE])(func)
        names.append(f"{func.__module__}.{func.__qualname__}")
    yield sorted(names)
    for name in names:
        unregister(name)


def store(event_id: str) -> RawEvent:
    return store_signed_stripe_event(stripe_event(event_id, EVENT_TYPE))


def settle_batch() -> list[str]:
    """raw_events_verify_batch's statements, as the debug cursor records them."""
    with CaptureQueriesContext(connection) as queries:
        raw_events_verify_batch(limit=100)
    return [query["sql"] for query in queries.captured_queries]


def test_a_batch_of_30_takes_the_statements_a_batch_of_3_takes(two_handlers):
    for n in range(3):
        store(f"evt_small_{n}")
    small = settle_batch()
    for n in range(30):
        store(f"evt_large_{n}")
    large = settle_batch()

    # executemany is recorded as one entry "N times: …" but is N statements on the server.
    assert [sql for sql in large if " times: " in sql] == []
    assert len(large) == len(small)
    assert (
        RawEvent.objects.filter(signature_status="verified", dispatch_status="dispatched").count()
        == 33
    )
    assert Delivery.objects.count() == 66


def test_only_a_key_won_earlier_is_looked_up(two_handlers):
    original = store("evt_original")
    store("evt_other")
    copy_in_batch = store("evt_other")  # a redelivery within the same batch
    first = settle_batch()
    lookups = [sql for sql in first if 'FROM "ingress_dedupkey"' in sql]
    assert lookups == []  # the INSERT … RETURNING said who won every key

    late_copy = store("evt_original")  # a redelivery of an event settled in the batch before
    second = settle_batch()
    assert len([sql for sql in second if 'FROM "ingress_dedupkey"' in sql]) == 1

    copy_in_batch.refresh_from_db()
    late_copy.refresh_from_db()
    other = DedupKey.objects.get(key="id:evt_other").raw_event_id
    assert (copy_in_batch.dispatch_status, copy_in_batch.duplicate_of_id) == ("duplicate", other)
    assert (late_copy.dispatch_status, late_copy.duplicate_of_id) == ("duplicate", original.id)
    assert not Delivery.objects.filter(raw_event_id__in=[copy_in_batch.id, late_copy.id]).exists()


def test_deliveries_are_written_as_built_one_per_event_and_handler(two_handlers):
    before = timezone.now()
    events = [store(f"evt_fanout_{n}") for n in range(4)]
    settle_batch()

    rows = list(
        Delivery.objects.order_by("raw_event_id", "handler").values_list(
            "raw_event_id", "handler", "status", "attempts", "total_attempts", "last_error"
        )
    )
    assert rows == [
        (event.id, name, "pending", 0, 0, "") for event in events for name in two_handlers
    ]
    for delivery in Delivery.objects.all():
        assert before <= delivery.next_attempt_at <= delivery.created_at
        assert delivery.claimed_at is None and delivery.finished_at is None
    for event in RawEvent.objects.all():
        assert event.dedup_key == f"id:{stripe_event_id(event)}"
        assert (event.verify_count, event.event_type, event.matched_secret_index) == (
            1,
            EVENT_TYPE,
            0,
        )


def stripe_event_id(event: RawEvent) -> str:
    return json.loads(bytes(event.body))["id"]
