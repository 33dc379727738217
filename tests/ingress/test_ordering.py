"""Events in order, where order matters (issue 13): a handler declared with an ordering key
never runs two deliveries of one key at once, and never an older event (by the provider's
event time, ties by received order) after a newer one was handled — the late older one is
`superseded`, visibly, with the delivery it lost to, and replayable by force."""

import json
import random
import threading
import time
from collections import Counter, defaultdict

import pytest
from django.db import connection
from django.utils import timezone

from ingress.deliveries import deliveries_run_due
from ingress.handlers import unregister, webhook_handler
from ingress.inbox import inbox_run_once, raw_events_verify_batch
from ingress.models import Delivery, RawEvent
from ingress.services import raw_event_replay, raw_events_replay_batch
from tests.support.signing import store_signed_stripe_event

ORDERED_TYPE = "test.ordering"
UNORDERED_TYPE = "test.concurrency"
BASE_TIME = 1_700_000_000  # Stripe's `created`: Unix seconds


class OrderedRecorder:
    """Records each call as (key, created, raw event id) and how many ran at once per key."""

    def __init__(self):
        self.calls: list[tuple[str, int, int]] = []
        self.running: Counter[str] = Counter()
        self.most_at_once = 0
        self.lock = threading.Lock()
        self.pause_seconds = 0.0

    def __call__(self, event, payload):
        key = payload["data"]["object"]["id"]
        with self.lock:
            self.running[key] += 1
            self.most_at_once = max(self.most_at_once, self.running[key])
        time.sleep(self.pause_seconds)  # widens the window two workers of one key would share
        with self.lock:
            self.calls.append((key, payload["created"], event.id))
            self.running[key] -= 1


@pytest.fixture
def ordered_handler():
    recorder = OrderedRecorder()

    def on_ordered(event, payload):
        recorder(event, payload)

    webhook_handler(
        provider="stripe",
        event_types=[ORDERED_TYPE],
        ordering_key="data.object.id",
        event_time="created",
    )(on_ordered)
    yield recorder
    unregister(f"{on_ordered.__module__}.{on_ordered.__qualname__}")


def store(key: str, created: int | None, *, n: int, event_type: str = ORDERED_TYPE) -> RawEvent:
    body: dict[str, object] = {"id": f"evt_{key}_{n}", "object": "event", "type": event_type}
    body["data"] = {"object": {"id": key}}
    if created is not None:
        body["created"] = created
    return store_signed_stripe_event(json.dumps(body).encode())


def delivery_of(event: RawEvent) -> Delivery:
    return Delivery.objects.get(raw_event_id=event.id)


@pytest.mark.django_db
def test_a_late_older_event_is_superseded_by_the_newer_one_handled(ordered_handler):
    newer = store("cs_1", BASE_TIME + 10, n=2)
    inbox_run_once()
    older = store("cs_1", BASE_TIME + 5, n=1)  # sent first by the provider, arrived last
    inbox_run_once()

    assert [call[2] for call in ordered_handler.calls] == [newer.id]
    lost = delivery_of(older)
    assert (lost.status, lost.superseded_by_id, lost.attempts) == (
        "superseded",
        delivery_of(newer).id,
        0,
    )
    assert lost.finished_at is not None
    older.refresh_from_db()
    assert older.handled_at is not None  # finished: nothing about it is in flight
    assert lost.event_time is not None
    assert (lost.ordering_key, lost.event_time.timestamp()) == ("cs_1", BASE_TIME + 5)

    # A plain replay keeps the verdict; a forced one runs it, despite the newer event.
    counts = raw_events_replay_batch(raw_event_ids=[older.id])
    assert (counts.deliveries_armed, counts.superseded_kept) == (0, 1)
    counts = raw_events_replay_batch(raw_event_ids=[older.id], force=True)
    assert (counts.deliveries_armed, counts.superseded_kept) == (1, 0)
    inbox_run_once()
    assert [call[2] for call in ordered_handler.calls] == [newer.id, older.id]
    lost.refresh_from_db()
    assert (lost.status, lost.forced, lost.superseded_by_id) == ("done", True, None)


@pytest.mark.django_db
def test_a_replayed_older_event_is_superseded_not_run_after_a_newer_one(ordered_handler):
    older = store("cs_1", BASE_TIME + 1, n=1)
    newer = store("cs_1", BASE_TIME + 2, n=2)
    inbox_run_once()
    assert [call[2] for call in ordered_handler.calls] == [older.id]  # a key's head per pass
    inbox_run_once()
    assert [call[2] for call in ordered_handler.calls] == [older.id, newer.id]
    assert raw_event_replay(raw_event=older) == 1
    inbox_run_once()
    assert len(ordered_handler.calls) == 2
    assert delivery_of(older).status == "superseded"


@pytest.mark.django_db
def test_a_key_runs_one_delivery_at_a_time_and_other_keys_go_on(ordered_handler):
    first = store("cs_1", BASE_TIME + 1, n=1)
    second = store("cs_1", BASE_TIME + 2, n=2)
    other = store("cs_2", BASE_TIME + 1, n=3)
    raw_events_verify_batch()
    Delivery.objects.filter(raw_event_id=first.id).update(
        status="processing", claimed_at=timezone.now()
    )  # a worker is running cs_1's head
    assert deliveries_run_due() == 1
    assert [call[2] for call in ordered_handler.calls] == [other.id]
    assert delivery_of(second).status == "pending"
    Delivery.objects.filter(raw_event_id=first.id).update(status="done")
    assert deliveries_run_due() == 1
    assert [call[2] for call in ordered_handler.calls] == [other.id, second.id]


@pytest.fixture
def unordered_handler():
    calls: list[int] = []

    def on_unordered(event, payload):
        calls.append(event.id)

    webhook_handler(provider="stripe", event_types=[UNORDERED_TYPE])(on_unordered)
    yield calls
    unregister(f"{on_unordered.__module__}.{on_unordered.__qualname__}")


@pytest.mark.django_db
def test_a_blocked_key_holds_back_neither_other_keys_nor_unordered_handlers(
    ordered_handler, unordered_handler
):
    blocked = [store("cs_1", BASE_TIME + n, n=n) for n in range(20)]
    raw_events_verify_batch()  # due first
    free = store("cs_2", BASE_TIME, n=100)
    unordered = [store(f"u_{n}", None, n=200 + n, event_type=UNORDERED_TYPE) for n in range(3)]
    raw_events_verify_batch()
    Delivery.objects.filter(raw_event_id=blocked[0].id).update(
        status="processing", claimed_at=timezone.now()
    )
    # The blocked key's 19 due deliveries come first in due order; they take no room.
    assert deliveries_run_due(limit=3) == 4  # 3 unordered + the free key's head
    assert sorted(unordered_handler) == sorted(e.id for e in unordered)
    assert [call[2] for call in ordered_handler.calls] == [free.id]
    assert Delivery.objects.filter(status="pending").count() == 19


@pytest.mark.django_db
def test_ties_and_missing_event_times_go_by_received_order(ordered_handler):
    first = store("cs_1", BASE_TIME, n=1)
    second = store("cs_1", BASE_TIME, n=2)  # same second: received order decides
    undated = store("cs_2", None, n=3)  # no `created`: its received time
    keyless = store_signed_stripe_event(
        json.dumps({"id": "evt_nokey", "type": ORDERED_TYPE, "data": {"object": {}}}).encode()
    )
    # `inbox_run_once` verifies in received order and claims each key's head per pass.
    for _ in range(3):
        inbox_run_once()
    assert [call[2] for call in ordered_handler.calls if call[0] == "cs_1"] == [
        first.id,
        second.id,
    ]
    undated.refresh_from_db()
    assert delivery_of(undated).event_time == undated.received_at
    # A payload without the key is delivered unordered (and the handler sees it as it is).
    assert delivery_of(keyless).ordering_key == ""


# --- four workers, shuffled deliveries of the same keys ------------------------------------

KEYS = [f"cs_{k}" for k in range(6)]
FIRST_WAVE = (1, 2, 4, 6)  # ranks (seconds after BASE_TIME) sent first, per key
SECOND_WAVE = (0, 3, 5, 7, 8, 9)  # then these; 0, 3 and 5 are older than 6, handled by then


def run_workers(count: int, work, deadline_seconds: float = 60.0) -> list[BaseException]:
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def worker():
        try:
            start.wait()
            stop_at = time.monotonic() + deadline_seconds
            idle = 0
            while time.monotonic() < stop_at and idle < 3:
                idle = idle + 1 if work() else 0
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


def drain(workers: int = 4) -> None:
    # Small batches, so that verifying and running interleave across the workers.
    errors = run_workers(workers, lambda: inbox_run_once(limit=3).idle)
    assert errors == []


def store_shuffled(ranks, rng, counter) -> dict[int, tuple[str, int]]:
    wave = [(key, rank) for key in KEYS for rank in ranks]
    rng.shuffle(wave)
    stored = {}
    for key, rank in wave:
        counter[0] += 1
        stored[store(key, BASE_TIME + rank, n=counter[0]).id] = (key, rank)
    return stored


@pytest.mark.django_db(transaction=True)
def test_four_workers_keep_each_key_in_order_and_supersede_the_late_older_ones(
    ordered_handler,
):
    ordered_handler.pause_seconds = 0.003
    unordered_calls: Counter[int] = Counter()

    def on_unordered(event, payload):
        unordered_calls[event.id] += 1

    webhook_handler(provider="stripe", event_types=[UNORDERED_TYPE])(on_unordered)
    rng = random.Random(13)
    counter = [0]
    try:
        events = store_shuffled(FIRST_WAVE, rng, counter)
        unordered = [
            store(f"u_{n}", None, n=1000 + n, event_type=UNORDERED_TYPE) for n in range(30)
        ]
        drain()
        newest_first_wave = {
            key: delivery_of(RawEvent(id=i)).id
            for i, (key, rank) in events.items()
            if rank == max(FIRST_WAVE)
        }
        assert set(
            Delivery.objects.filter(id__in=newest_first_wave.values()).values_list(
                "status", flat=True
            )
        ) == {"done"}
        second = store_shuffled(SECOND_WAVE, rng, counter)
        events.update(second)
        drain()
    finally:
        unregister(f"{on_unordered.__module__}.{on_unordered.__qualname__}")

    calls = ordered_handler.calls
    assert ordered_handler.most_at_once == 1  # never two of one key at once
    per_key = defaultdict(list)
    for key, created, raw_event_id in calls:
        per_key[key].append((created, raw_event_id))
    for key, runs in per_key.items():
        assert runs == sorted(runs), key  # never an older one after a newer one
    assert len({raw_event_id for _, _, raw_event_id in calls}) == len(calls)  # once each

    deliveries = {d.raw_event_id: d for d in Delivery.objects.filter(raw_event_id__in=list(events))}
    assert {d.status for d in deliveries.values()} <= {"done", "superseded"}
    handled = {raw_event_id for _, _, raw_event_id in calls}
    assert handled == {i for i, d in deliveries.items() if d.status == "done"}
    by_id = {d.id: d for d in deliveries.values()}
    for raw_event_id, delivery in deliveries.items():
        if delivery.status != "superseded":
            continue
        assert delivery.superseded_by_id is not None
        winner = by_id[delivery.superseded_by_id]
        assert winner.status == "done"
        assert winner.ordering_key == delivery.ordering_key
        assert (winner.event_time, winner.raw_event_id) > (delivery.event_time, raw_event_id)
    # The second wave's events older than a handled first-wave one can only be superseded.
    late = [i for i, (key, rank) in second.items() if rank < max(FIRST_WAVE)]
    assert {deliveries[i].status for i in late} == {"superseded"}
    # Unordered handlers as ever: every event once.
    assert set(unordered_calls) == {e.id for e in unordered}
    assert set(unordered_calls.values()) == {1}

    # Forced replays of every superseded one: run, one at a time per key, all done.
    superseded = [i for i, d in deliveries.items() if d.status == "superseded"]
    ordered_handler.most_at_once = 0
    counts = raw_events_replay_batch(raw_event_ids=superseded, force=True)
    assert counts.deliveries_armed == len(superseded)
    drain()
    assert ordered_handler.most_at_once == 1
    assert set(Delivery.objects.values_list("status", flat=True)) == {"done"}
    assert {raw_event_id for _, _, raw_event_id in ordered_handler.calls} == set(events)
