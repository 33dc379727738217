"""Pause and resume (issue 13): while a handler (or a source) is paused, events are still
received, stored, verified and deduplicated; their deliveries are held — never claimed, never
charged — and resuming releases them in received order, rate-limited."""

import time
from datetime import timedelta
from itertools import pairwise

import pytest
from django.db import connection
from django.utils import timezone

from ingress.deliveries import deliveries_run_due
from ingress.handlers import handlers_for
from ingress.inbox import inbox_run_once, raw_events_verify_batch
from ingress.models import Delivery, DeliveryAttempt, HandlerPause, RawEvent
from ingress.selectors import deliveries_held_count, handler_pauses_active
from ingress.services import (
    PAUSE_ALREADY,
    PAUSE_NEEDS_ONE_SCOPE,
    PAUSE_UNKNOWN_HANDLER,
    PAUSE_UNKNOWN_SOURCE,
    RESUME_NO_RATE,
    RESUME_NOT_PAUSED,
    PauseRefused,
    handler_pause,
    handler_resume,
    raw_event_replay,
)
from tests.ingress import test_inbox
from tests.ingress.test_inbox import receive_github
from tests.support.processes import app_env, start_manage
from tests.support.signing import store_signed_stripe_event, stripe_event

push_handler = test_inbox.push_handler  # the fixture: a registered `push` handler
stripe_handler = test_inbox.stripe_handler  # and one for Stripe's `test.concurrency`


def handler_name(provider: str, event_type: str) -> str:
    [spec] = handlers_for(provider, event_type)
    return spec.name


@pytest.mark.django_db
def test_a_paused_handler_holds_everything_uncharged_and_resume_releases_in_received_order(
    client, push_handler, settings
):
    settings.INBOX_RESUME_RELEASE_PER_SECOND = 10.0
    name = handler_name("github", "push")
    assert handler_pause(handler=name).deliveries == 0
    events = [receive_github(client, delivery=f"d-{n}") for n in range(5)]
    copy = receive_github(client, delivery="d-0")

    for _ in range(3):
        inbox_run_once()

    # Received, verified and deduplicated as ever; delivered to nobody, charged nothing.
    assert set(RawEvent.objects.values_list("signature_status", flat=True)) == {"verified"}
    copy.refresh_from_db()
    assert copy.dispatch_status == "duplicate"
    assert push_handler.calls == []
    assert (
        list(Delivery.objects.values_list("status", "attempts", "total_attempts"))
        == [("held", 0, 0)] * 5
    )
    assert not DeliveryAttempt.objects.exists()
    [active] = handler_pauses_active()
    assert (active.handler, active.held) == (name, 5)
    assert deliveries_held_count() == 5

    before = timezone.now()
    change = handler_resume(handler=name)

    assert (change.deliveries, change.release_seconds) == (5, 0.5)
    released = list(
        Delivery.objects.order_by("raw_event_id").values_list("status", "next_attempt_at")
    )
    assert [status for status, _ in released] == ["pending"] * 5
    # Due one after another, 1/10 s apart, in received order: the claim takes the oldest due.
    due = [at for _, at in released]
    assert due[0] >= before
    assert [b - a for a, b in pairwise(due)] == [timedelta(seconds=0.1)] * 4
    assert deliveries_run_due(now=due[0]) == 1  # only what is due: the rate holds
    assert deliveries_run_due(now=due[-1]) == 4
    assert [call[0] for call in push_handler.calls] == [e.id for e in events]
    assert handler_pauses_active() == []
    pause = HandlerPause.objects.get()
    assert (pause.released, pause.resumed_at is not None) == (5, True)


@pytest.mark.django_db
def test_a_delivery_that_turns_pending_while_paused_is_held_when_due_never_run(
    client, push_handler
):
    handled = receive_github(client, delivery="handled")
    inbox_run_once()
    waiting = receive_github(client, delivery="waiting")
    raw_events_verify_batch()  # its delivery is pending and due before the pause
    assert handler_pause(handler=handler_name("github", "push")).deliveries == 1
    # However a delivery turns pending while paused — created by a worker that had not seen
    # the pause yet, a retry, a stale re-arm, a replay — it is held at the claim, uncharged.
    Delivery.objects.filter(raw_event_id=waiting.id).update(status="pending")
    assert raw_event_replay(raw_event=handled) == 1
    assert deliveries_run_due() == 0
    assert raw_event_replay(raw_event=waiting) == 0  # and a held one stays held
    assert dict(Delivery.objects.values_list("raw_event_id", "status")) == {
        handled.id: "held",
        waiting.id: "held",
    }
    assert list(
        Delivery.objects.order_by("raw_event_id").values_list("attempts", "total_attempts")
    ) == [(0, 1), (0, 0)]
    assert [call[0] for call in push_handler.calls] == [handled.id]
    waiting.refresh_from_db()
    assert waiting.handled_at is None  # held is unfinished


@pytest.mark.django_db
def test_pausing_a_source_holds_only_the_deliveries_of_its_events(
    client, push_handler, stripe_handler
):
    handler_pause(source="github")
    github = receive_github(client)
    stripe = store_signed_stripe_event(stripe_event("evt_1", "test.concurrency"))
    inbox_run_once()
    assert Delivery.objects.get(raw_event_id=github.id).status == "held"
    assert Delivery.objects.get(raw_event_id=stripe.id).status == "done"
    [active] = handler_pauses_active()
    assert (active.source, active.held, active.scope) == ("github", 1, "source github")
    assert handler_resume(source="github").deliveries == 1
    inbox_run_once()
    assert [call[0] for call in push_handler.calls] == [github.id]


@pytest.mark.django_db
def test_pause_and_resume_refuse_what_they_cannot_do(push_handler, settings):
    name = handler_name("github", "push")
    refusals = {
        PAUSE_NEEDS_ONE_SCOPE.format(given="neither"): dict(),
        PAUSE_NEEDS_ONE_SCOPE.format(given="both"): dict(handler=name, source="github"),
        PAUSE_UNKNOWN_HANDLER.format(name="no.such"): dict(handler="no.such"),
        PAUSE_UNKNOWN_SOURCE.format(name="nowhere"): dict(source="nowhere"),
    }
    for message, scope in refusals.items():
        with pytest.raises(PauseRefused) as refused:
            handler_pause(**scope)
        assert str(refused.value) == message
    with pytest.raises(PauseRefused) as refused:
        handler_resume(handler=name)
    assert str(refused.value) == RESUME_NOT_PAUSED.format(scope=f"handler {name}")
    pause = handler_pause(handler=name).pause
    with pytest.raises(PauseRefused) as refused:
        handler_pause(handler=name)
    assert str(refused.value) == PAUSE_ALREADY.format(
        scope=f"handler {name}", since=pause.paused_at
    )
    assert HandlerPause.objects.count() == 1
    settings.INBOX_RESUME_RELEASE_PER_SECOND = 0.0
    with pytest.raises(PauseRefused) as refused:
        handler_resume(handler=name)
    assert str(refused.value) == RESUME_NO_RATE.format(rate=0.0)
    settings.INBOX_RESUME_RELEASE_PER_SECOND = 100.0
    handler_resume(handler=name)
    handler_pause(handler=name)  # a new pause after a resume is a new row
    assert HandlerPause.objects.filter(resumed_at__isnull=True).count() == 1


# --- under load, with the worker as it runs in production ----------------------------------

CHECKOUT = "checkout.session.completed"
EVENTS = 150


def _wait(condition, workers, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(w.alive for w in workers), [w.output()[-2000:] for w in workers]
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_pause_under_load_loses_nothing_charges_nothing_and_releases_in_received_order(
    tmp_path, settings
):
    """Two real `process_inbox` workers drain while the recaps' checkout handler is paused
    (a checkout of another product: the handler returns at once); one finishes the release,
    so that the order it runs the released deliveries in is the order they were released."""
    settings.INBOX_RESUME_RELEASE_PER_SECOND = 300.0
    name = handler_name("stripe", CHECKOUT)
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    env = app_env(url, INBOX_IDLE_SLEEP_SECONDS="0.05", INBOX_BATCH_SIZE="20")
    workers = [
        start_manage(["process_inbox"], env, log=tmp_path / f"inbox-{n}.log") for n in range(2)
    ]
    try:
        handler_pause(handler=name)
        stored = []
        for n in range(EVENTS):
            body = stripe_event(f"evt_pause_{n}", CHECKOUT, {"object": {"id": f"cs_{n}"}})
            stored.append(store_signed_stripe_event(body).id)
            if n % 50 == 49:  # a provider redelivery now and then: deduplicated as ever
                store_signed_stripe_event(body)
        deliveries = Delivery.objects.filter(handler=name)
        _wait(
            lambda: (
                deliveries.filter(status="held").count() == EVENTS
                and not RawEvent.objects.filter(signature_status="pending").exists()
            ),
            workers,
            timeout=60,
            what="every delivery held",
        )
        time.sleep(0.5)  # more passes of both workers over the held rows
        assert deliveries.count() == EVENTS
        assert set(deliveries.values_list("status", "attempts", "total_attempts")) == {
            ("held", 0, 0)
        }
        assert not DeliveryAttempt.objects.exists()
        assert RawEvent.objects.filter(dispatch_status="duplicate").count() == EVENTS // 50

        assert workers.pop().stop() == 0
        assert handler_resume(handler=name).deliveries == EVENTS
        _wait(
            lambda: deliveries.filter(status="done").count() == EVENTS,
            workers,
            timeout=60,
            what="every delivery done",
        )
    finally:
        for worker in workers:
            worker.stop()
    runs = list(
        DeliveryAttempt.objects.filter(delivery__handler=name)
        .order_by("started_at", "id")
        .values_list("delivery__raw_event_id", "delivery__next_attempt_at", "started_at")
    )
    assert [raw_event_id for raw_event_id, _, _ in runs] == stored  # each once, in order
    assert all(started >= released for _, released, started in runs)  # not before its turn
    assert set(deliveries.values_list("attempts", "total_attempts")) == {(1, 1)}
