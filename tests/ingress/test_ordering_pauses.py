"""Adversarial review of issue 13's pause and ordering promises (H7): the states an operator
or an odd payload can push a key or a pause into, and that each one has a way out."""

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ingress.deliveries import deliveries_rearm_orphaned, deliveries_run_due
from ingress.handlers import PermanentHandlerError, unregister, webhook_handler
from ingress.inbox import inbox_run_once, raw_events_verify_batch
from ingress.models import Delivery, DeliveryAttempt, RawEvent
from ingress.selectors import deliveries_held_count
from ingress.services import handler_pause, handler_resume, raw_events_replay_batch
from tests.ingress.test_ordering import BASE_TIME, ORDERED_TYPE, delivery_of
from tests.ingress.test_ordering import store as store_ordered
from tests.support.signing import store_signed_stripe_event

HANDLER = "tests.ingress.test_ordering_pauses.on_review_ordered"
calls: list[int] = []  # raw event ids, in the order the handler ran them
poisoned: set[int] = set()  # raw event ids the handler refuses for good
instead: list = []  # a test's own behaviour for the handler, when set


def on_review_ordered(event, payload):
    if event.id in poisoned:
        raise PermanentHandlerError("refused for good")
    if instead:
        instead[0](event, payload)
    calls.append(event.id)


@pytest.fixture
def ordered():
    calls.clear()
    poisoned.clear()
    instead.clear()
    webhook_handler(
        provider="stripe",
        event_types=[ORDERED_TYPE],
        ordering_key="data.object.id",
        event_time="created",
    )(on_review_ordered)
    yield
    unregister(HANDLER)


def ran() -> list[int]:
    return list(calls)


@pytest.fixture
def two_stripe_sources(settings):
    # A second Stripe endpoint (say, another account) with the same secret: one key's events
    # can arrive through either.
    settings.WEBHOOK_SOURCES = {
        **settings.WEBHOOK_SOURCES,
        "stripe_eu": {"provider": "stripe", "secrets_env": "STRIPE_WEBHOOK_SECRET"},
    }


@pytest.mark.django_db
def test_resuming_a_source_leaves_held_what_a_handler_pause_still_covers(ordered):
    event = store_ordered("cs_1", BASE_TIME, n=1)
    handler_pause(handler=HANDLER)
    handler_pause(source="stripe")
    inbox_run_once()
    assert delivery_of(event).status == "held"

    change = handler_resume(source="stripe")

    # Still held (and counted as held on the ops page), not released to be re-held later.
    assert change.deliveries == 0
    assert delivery_of(event).status == "held"
    assert deliveries_held_count() == 1
    assert handler_resume(handler=HANDLER).deliveries == 1
    inbox_run_once()
    assert ran() == [event.id]


@pytest.mark.django_db
def test_a_held_head_keeps_its_key_waiting_so_the_key_stays_in_order(ordered, two_stripe_sources):
    # The key's older event came through the paused source, its newer one through the other.
    older = store_ordered("cs_1", BASE_TIME + 1, n=1)
    newer = store_ordered("cs_1", BASE_TIME + 2, n=2)
    RawEvent.objects.filter(id=older.id).update(source="stripe_eu")
    handler_pause(source="stripe_eu")
    for _ in range(3):
        inbox_run_once()
    assert ran() == []  # the newer one waits behind its key's held head
    assert (delivery_of(older).status, delivery_of(newer).status) == ("held", "pending")

    handler_resume(source="stripe_eu")
    for _ in range(3):
        inbox_run_once()
    assert ran() == [older.id, newer.id]  # in order; nothing superseded by the pause
    assert delivery_of(older).status == "done"


@pytest.mark.django_db
def test_a_permanently_failing_head_dies_and_lets_its_key_go_on(ordered):
    poison = store_ordered("cs_1", BASE_TIME + 1, n=1)
    nxt = store_ordered("cs_1", BASE_TIME + 2, n=2)
    poisoned.add(poison.id)
    inbox_run_once()
    assert delivery_of(poison).status == "dead"
    inbox_run_once()
    assert ran() == [nxt.id]
    # A plain replay of the dead head, once fixed, cannot run it after the newer one...
    poisoned.clear()
    raw_events_replay_batch(raw_event_ids=[poison.id])
    inbox_run_once()
    assert delivery_of(poison).status == "superseded"
    # ...a forced one does.
    raw_events_replay_batch(raw_event_ids=[poison.id], force=True)
    inbox_run_once()
    assert ran() == [nxt.id, poison.id]


@pytest.mark.django_db
def test_a_head_in_long_backoff_is_released_now_by_a_replay(ordered):
    head = store_ordered("cs_1", BASE_TIME + 1, n=1)
    behind = store_ordered("cs_1", BASE_TIME + 2, n=2)
    raw_events_verify_batch()
    Delivery.objects.filter(raw_event_id=head.id).update(
        attempts=3, next_attempt_at=timezone.now() + timedelta(hours=6)
    )
    assert deliveries_run_due() == 0  # the key waits for its head, by design
    # The operator's way out: replay the head ("try it now"), attempts reset.
    raw_events_replay_batch(raw_event_ids=[head.id])
    deliveries_run_due()
    deliveries_run_due()
    assert ran() == [head.id, behind.id]


@pytest.mark.django_db
def test_a_dead_worker_holding_a_key_is_rearmed_and_its_key_keeps_order(ordered):
    head = store_ordered("cs_1", BASE_TIME + 1, n=1)
    behind = store_ordered("cs_1", BASE_TIME + 2, n=2)
    raw_events_verify_batch()
    long_ago = timezone.now() - timedelta(days=1)  # past DELIVERY_STALE_AFTER_SECONDS
    # Claimed by a worker that died: processing, never finished.
    Delivery.objects.filter(raw_event_id=head.id).update(
        status="processing", claimed_at=long_ago, attempts=1, total_attempts=1
    )
    assert deliveries_run_due() == 0  # the key's running delivery holds it
    assert deliveries_rearm_orphaned() == 1
    deliveries_run_due()
    deliveries_run_due()
    assert ran() == [head.id, behind.id]


@pytest.mark.django_db
def test_a_stale_rearm_of_a_paused_handler_is_held_not_run(ordered):
    head = store_ordered("cs_1", BASE_TIME + 1, n=1)
    raw_events_verify_batch()
    Delivery.objects.filter(raw_event_id=head.id).update(
        status="processing",
        claimed_at=timezone.now() - timedelta(days=1),
        attempts=1,
        total_attempts=1,
    )
    handler_pause(handler=HANDLER)
    assert deliveries_rearm_orphaned() == 1
    assert deliveries_run_due() == 0
    row = delivery_of(head)
    # Claimed once, by its dead worker (total_attempts), and not charged for its death.
    assert (row.status, row.attempts, row.total_attempts) == ("held", 0, 1)
    assert ran() == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "key",
    ["a\x00b", "\ud800lone", {"nested": 1}, ["a"], 7, True, None, ""],
    ids=["nul", "lone-surrogate", "object", "array", "number", "bool", "null", "empty"],
)
def test_an_odd_ordering_key_never_breaks_the_inbox(ordered, key):
    body = {"id": "evt_odd", "object": "event", "type": ORDERED_TYPE, "created": BASE_TIME}
    body["data"] = {"object": {"id": key}}
    event = store_signed_stripe_event(json.dumps(body).encode())  # ensure_ascii: \u escapes
    other = store_ordered("cs_1", BASE_TIME, n=1)

    inbox_run_once()

    event.refresh_from_db()
    if isinstance(key, str) and key != key.encode("utf-8", "replace").decode().replace("\x00", ""):
        # Text PostgreSQL cannot store: the verify side refuses the event, visibly, before
        # any delivery (and its key) is written; the rest of the batch goes on.
        assert (event.signature_status, ran()) == ("rejected", [other.id])
        return
    assert sorted(ran()) == sorted([event.id, other.id])
    row = delivery_of(event)
    assert row.status == "done"
    if isinstance(key, dict | list) or key in (None, ""):
        assert row.ordering_key == ""  # no usable key: delivered unordered
    else:
        assert row.ordering_key != ""


@pytest.mark.django_db(transaction=True)
def test_a_pause_while_a_delivery_runs_lets_it_finish_and_holds_its_retry(ordered):
    event = store_ordered("cs_1", BASE_TIME + 1, n=1)
    raw_events_verify_batch()
    started, go_on = threading.Event(), threading.Event()

    def slow_then_fail(event, payload):
        started.set()
        assert go_on.wait(20)
        raise RuntimeError("downstream unavailable")  # transient: retried, with a backoff

    errors: list[BaseException] = []

    def worker():
        try:
            deliveries_run_due()
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    instead.append(slow_then_fail)
    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert started.wait(20)
        change = handler_pause(handler=HANDLER)  # mid-run: the running one is not held
        assert (change.deliveries, delivery_of(event).status) == (0, "processing")
    finally:
        go_on.set()
        thread.join(20)
    assert errors == []
    row = delivery_of(event)
    assert (row.status, row.attempts) == ("pending", 1)  # its failure recorded, in backoff
    # When its retry comes due the pause holds it, uncharged.
    assert deliveries_run_due(now=row.next_attempt_at + timedelta(seconds=1)) == 0
    row = delivery_of(event)
    assert (row.status, row.attempts, row.total_attempts) == ("held", 1, 1)


@pytest.mark.django_db
@pytest.mark.parametrize("max_keys", [1000, 4, 3])
def test_the_skip_scan_and_the_sorted_read_find_the_same_key_heads(ordered, monkeypatch, max_keys):
    from ingress.deliveries import ordering
    from ingress.deliveries.statements import KEY_HEADS
    from kernel.queue import statement

    monkeypatch.setattr(ordering, "SKIP_SCAN_MAX_KEYS", max_keys)  # 4 keys; 3: falls back
    ordering.head_read_choice().sorted_passes_left = 0
    events = {
        key: [store_ordered(key, BASE_TIME + n, n=n) for n in (1, 2)]
        for key in ("running", "backoff", "held", "due")
    }
    raw_events_verify_batch()
    now = timezone.now()
    heads = {key: delivery_of(pair[0]).id for key, pair in events.items()}
    Delivery.objects.filter(id=heads["running"]).update(status="processing", claimed_at=now)
    Delivery.objects.filter(id=heads["backoff"]).update(next_attempt_at=now + timedelta(hours=1))
    Delivery.objects.filter(id=heads["held"]).update(status="held")

    with connection.cursor() as cursor:
        found = ordering.key_head_candidates(cursor, 100, now)
        cursor.execute(statement(KEY_HEADS, "ingress_delivery"), [now, 100])
        sorted_read = [row[0] for row in cursor.fetchall()]

    assert found == sorted_read == [heads["due"]]  # nothing behind a running/backoff/held head
    # A walk that met more keys than it may take sends the next passes to the sorted read.
    fell_back = ordering.SORTED_READ_PASSES - 1
    choice = ordering.head_read_choice()
    assert choice.sorted_passes_left == (fell_back if max_keys < 4 else 0)
    choice.sorted_passes_left = 0  # per process: not carried into the next test


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_real_workers_rearm_a_dead_workers_key_and_keep_it_in_order(tmp_path):
    """A worker died holding a key's head (processing, long ago); two real `process_inbox`
    workers re-arm it as stale and run the key's events strictly in event-time order (the
    recaps' ordered checkout handler; a checkout of another product returns at once)."""
    from tests.ingress.test_pause import _wait
    from tests.support.processes import app_env, start_manage

    checkout = "recaps.handlers.record_checkout_session"
    keys = ["cs_dead", "cs_a", "cs_b"]
    stored: dict[str, list[int]] = {key: [] for key in keys}
    for n in range(4):
        for key in keys:
            body = {"id": f"evt_{key}_{n}", "object": "event", "created": BASE_TIME + n}
            body |= {"type": "checkout.session.completed", "data": {"object": {"id": key}}}
            stored[key].append(store_signed_stripe_event(json.dumps(body).encode()).id)
    raw_events_verify_batch()
    deliveries = Delivery.objects.filter(handler=checkout)
    assert deliveries.exclude(ordering_key="").count() == 12
    deliveries.filter(raw_event_id=stored["cs_dead"][0]).update(
        status="processing",
        claimed_at=timezone.now() - timedelta(days=1),
        attempts=1,
        total_attempts=1,
    )
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    env = app_env(url, INBOX_IDLE_SLEEP_SECONDS="0.05", INBOX_BATCH_SIZE="2")
    workers = [
        start_manage(["process_inbox"], env, log=tmp_path / f"inbox-{n}.log") for n in range(2)
    ]
    try:
        _wait(
            lambda: deliveries.filter(status="done").count() == 12,
            workers,
            timeout=60,
            what="every delivery done",
        )
    finally:
        for worker in workers:
            worker.stop()
    for key in keys:
        runs = list(
            DeliveryAttempt.objects.filter(delivery__handler=checkout, delivery__ordering_key=key)
            .order_by("started_at", "id")
            .values_list("delivery__raw_event_id", flat=True)
        )
        assert runs == stored[key], key  # each once, in event-time order, nothing superseded


@pytest.mark.django_db
def test_a_forced_replay_while_paused_is_held_and_still_forced_after_the_resume(ordered, settings):
    settings.INBOX_RESUME_RELEASE_PER_SECOND = 1000.0
    newer = store_ordered("cs_1", BASE_TIME + 2, n=2)
    inbox_run_once()
    older = store_ordered("cs_1", BASE_TIME + 1, n=1)
    inbox_run_once()
    assert delivery_of(older).status == "superseded"
    handler_pause(handler=HANDLER)

    raw_events_replay_batch(raw_event_ids=[older.id, newer.id], force=True)
    inbox_run_once()
    inbox_run_once()
    assert {delivery_of(e).status for e in (older, newer)} == {"held"}
    assert ran() == [newer.id]

    handler_resume(handler=HANDLER)
    for _ in range(3):
        deliveries_run_due(now=timezone.now() + timedelta(seconds=1))  # the release is due
    # Forced: the older runs despite the newer handled before, then the newer, in key order.
    assert ran() == [newer.id, older.id, newer.id]
    assert (delivery_of(older).status, delivery_of(older).forced) == ("done", True)


@pytest.mark.django_db
def test_a_new_event_of_a_paused_ordered_handler_is_held_even_behind_a_held_head(ordered):
    head = store_ordered("cs_1", BASE_TIME + 1, n=1)
    raw_events_verify_batch()
    handler_pause(handler=HANDLER)
    later = store_ordered("cs_1", BASE_TIME + 2, n=2)
    for _ in range(2):
        inbox_run_once()
    # Not left pending (and uncounted) behind its key's held head.
    assert (delivery_of(head).status, delivery_of(later).status) == ("held", "held")
    assert deliveries_held_count() == 2


@pytest.mark.django_db
def test_a_dead_delivery_rearmed_while_paused_is_held(ordered):
    from ingress.services import deliveries_rearm_batch

    dead = store_ordered("cs_1", BASE_TIME + 1, n=1)
    poisoned.add(dead.id)
    inbox_run_once()
    assert delivery_of(dead).status == "dead"
    handler_pause(handler=HANDLER)
    head = store_ordered("cs_1", BASE_TIME, n=0)  # an older one, held: the key's head
    inbox_run_once()

    assert deliveries_rearm_batch(delivery_ids=[delivery_of(dead).id]).rearmed == 1
    inbox_run_once()
    assert (delivery_of(head).status, delivery_of(dead).status) == ("held", "held")
