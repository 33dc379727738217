"""The set-based replay and re-arm services the console's bulk jobs call (issue 13)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ingress.handlers import PermanentHandlerError, unregister, webhook_handler
from ingress.inbox import inbox_run_once
from ingress.models import Delivery, RawEvent
from ingress.services import (
    REPLAY_DUPLICATE,
    REPLAY_NOT_VERIFIED,
    deliveries_rearm_batch,
    raw_events_replay_batch,
)
from tests.ingress import test_inbox
from tests.ingress.test_inbox import receive_github

pytestmark = pytest.mark.django_db

push_handler = test_inbox.push_handler  # the fixture: a registered `push` handler


def test_a_batch_replays_the_verified_originals_and_says_why_it_refuses_the_rest(
    client, push_handler
):
    handled = [receive_github(client, delivery=f"d-{n}") for n in range(3)]
    rejected = receive_github(client, secret="wrong", delivery="bad")
    copy = receive_github(client, delivery="d-0")
    inbox_run_once()
    missing_id = max(e.id for e in [*handled, rejected, copy]) + 1000

    counts = raw_events_replay_batch(
        raw_event_ids=[e.id for e in handled] + [rejected.id, copy.id, missing_id]
    )

    assert (counts.requested, counts.replayed, counts.deliveries_armed) == (6, 3, 3)
    assert (counts.not_found, counts.nothing_to_arm, counts.already_queued) == (1, 0, 0)
    assert counts.refused == {
        rejected.id: REPLAY_NOT_VERIFIED.format(id=rejected.id, status="rejected"),
        copy.id: REPLAY_DUPLICATE.format(id=copy.id, original=handled[0].id),
    }
    assert set(Delivery.objects.values_list("status", flat=True)) == {"pending"}
    assert not RawEvent.objects.filter(handled_at__isnull=False).exists()
    inbox_run_once()
    assert sorted(call[0] for call in push_handler.calls) == sorted([e.id for e in handled] * 2)


def test_a_rerun_of_the_same_batch_queues_nothing_twice(client, push_handler):
    events = [receive_github(client, delivery=f"d-{n}") for n in range(4)]
    inbox_run_once()
    ids = [e.id for e in events]
    raw_events_replay_batch(raw_event_ids=ids)
    running = Delivery.objects.get(raw_event_id=events[0].id)
    Delivery.objects.filter(pk=running.pk).update(status="processing", claimed_at=timezone.now())

    again = raw_events_replay_batch(raw_event_ids=ids)

    # One delivery per (event, handler), still: the running one left alone, the rest pending.
    assert Delivery.objects.count() == 4
    assert (again.deliveries_armed, again.already_queued, again.nothing_to_arm) == (3, 1, 1)
    assert Delivery.objects.get(pk=running.pk).status == "processing"


def test_a_batch_reaches_handlers_registered_since_and_costs_a_few_statements(client, push_handler):
    events = [receive_github(client, delivery=f"d-{n}") for n in range(20)]
    inbox_run_once()

    def also_on_push(event, payload):
        push_handler(event, payload)

    webhook_handler(provider="github", event_types=["push"])(also_on_push)
    try:
        with CaptureQueriesContext(connection) as queries:
            counts = raw_events_replay_batch(raw_event_ids=[e.id for e in events])
    finally:
        unregister(f"{also_on_push.__module__}.{also_on_push.__qualname__}")
    assert counts.deliveries_armed == 40  # 20 re-armed, 20 new for the new handler
    assert Delivery.objects.count() == 40
    # Set-based: the same statements for 20 events as for one, not a few per event.
    assert len(queries) <= 12, [q["sql"][:80] for q in queries]


def test_dead_deliveries_are_rearmed_once_and_nothing_else_is(client, push_handler):
    push_handler.fail_with = PermanentHandlerError("no such repository")
    dead_event = receive_github(client, delivery="dead")
    inbox_run_once()
    push_handler.fail_with = None
    done_event = receive_github(client, delivery="done")
    inbox_run_once()
    dead = Delivery.objects.get(raw_event_id=dead_event.id)
    done = Delivery.objects.get(raw_event_id=done_event.id)
    assert (dead.status, done.status) == ("dead", "done")

    counts = deliveries_rearm_batch(delivery_ids=[dead.id, done.id])

    assert (counts.requested, counts.rearmed, counts.not_dead) == (2, 1, 1)
    dead.refresh_from_db()
    assert (dead.status, dead.attempts, dead.total_attempts) == ("pending", 0, 1)
    assert Delivery.objects.get(pk=done.pk).status == "done"
    assert deliveries_rearm_batch(delivery_ids=[dead.id]).rearmed == 0  # a re-run: nothing
    inbox_run_once()
    dead.refresh_from_db()
    assert dead.status == "done"
    assert list(dead.history.values_list("number", "outcome")) == [
        (1, "permanent"),
        (2, "done"),
    ]
    dead_event.refresh_from_db()
    assert dead_event.handled_at is not None
