"""Flow 2 end to end inside the app: receive → verify → dedup → deliveries → handlers."""

import json
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from ingress.deliveries import deliveries_rearm_orphaned, deliveries_run_due
from ingress.handlers import PermanentHandlerError, unregister, webhook_handler
from ingress.inbox import inbox_run_once, raw_events_verify_batch
from ingress.models import Delivery, RawEvent
from ingress.services import (
    REPLAY_DUPLICATE,
    REPLAY_NOT_VERIFIED,
    ReplayRefused,
    ReverifyRefused,
    raw_event_replay,
    raw_event_reverify,
)
from ingress.sources import reset_sources_cache
from tests.support.signing import github_headers, stripe_event, stripe_headers

pytestmark = pytest.mark.django_db


class Recorder:
    """A registered handler that records calls and can be told to fail."""

    def __init__(self):
        self.calls: list[tuple[int, dict]] = []
        self.fail_with: Exception | None = None
        self.lock = threading.Lock()

    def __call__(self, event, payload):
        with self.lock:
            self.calls.append((event.id, payload))
        if self.fail_with is not None:
            raise self.fail_with


@pytest.fixture
def push_handler():
    recorder = Recorder()

    def on_push(event, payload):
        recorder(event, payload)

    webhook_handler(provider="github", event_types=["push"])(on_push)
    yield recorder
    unregister(f"{on_push.__module__}.{on_push.__qualname__}")


@pytest.fixture
def stripe_handler():
    recorder = Recorder()

    def on_test_event(event, payload):
        recorder(event, payload)

    webhook_handler(provider="stripe", event_types=["test.concurrency"])(on_test_event)
    yield recorder
    unregister(f"{on_test_event.__module__}.{on_test_event.__qualname__}")


def receive_github(client, payload=None, *, delivery="d-1", event="push", secret=None):
    # Two GitHub events never have the same body (the same body and signature under another
    # delivery id is a replay, ingress/signature_replays.py): the default body names its delivery.
    body = json.dumps(payload or {"ref": "refs/heads/main", "delivery": delivery}).encode()
    headers = github_headers(body, secret=secret, event=event, delivery=delivery)
    response = client.post("/webhooks/github/", body, content_type="application/json", **headers)
    assert response.status_code == 202
    return RawEvent.objects.get(pk=response.json()["id"])


def test_verified_event_reaches_its_handler_once(client, push_handler):
    event = receive_github(client, {"ref": "refs/heads/main"})
    result = inbox_run_once()
    assert (result.verified, result.delivered) == (1, 1)
    event.refresh_from_db()
    assert event.signature_status == "verified"
    assert event.matched_secret_index == 0
    assert event.event_type == "push"
    assert event.dedup_key == "id:d-1"
    assert event.dispatch_status == "dispatched"
    assert event.verified_at >= event.received_at
    assert event.handled_at >= event.verified_at
    assert push_handler.calls == [(event.id, {"ref": "refs/heads/main"})]
    delivery = Delivery.objects.get(raw_event_id=event.id)
    assert (delivery.status, delivery.attempts) == ("done", 1)
    assert [a.outcome for a in delivery.history.all()] == ["done"]
    assert inbox_run_once().idle


def test_bad_signature_is_rejected_kept_and_never_delivered(client, push_handler):
    event = receive_github(client, secret="wrong secret")
    inbox_run_once()
    event.refresh_from_db()
    assert (event.signature_status, event.rejection_reason) == ("rejected", "bad_signature")
    assert event.dispatch_status == "not_dispatched"
    assert not Delivery.objects.exists()
    assert push_handler.calls == []


def test_copies_of_one_delivery_become_one_winner_and_duplicates(client, push_handler):
    first = receive_github(client, delivery="same")
    second = receive_github(client, delivery="same")
    inbox_run_once()
    inbox_run_once()  # a copy arriving in a later batch is still a duplicate
    third = receive_github(client, delivery="same")
    inbox_run_once()
    for copy in (second, third):
        copy.refresh_from_db()
        assert copy.dispatch_status == "duplicate"
        assert copy.duplicate_of_id == first.id
    assert [call[0] for call in push_handler.calls] == [first.id]


def test_event_without_handler_is_marked_not_lost(client, push_handler):
    event = receive_github(client, event="star")
    inbox_run_once()
    event.refresh_from_db()
    assert (event.signature_status, event.dispatch_status) == ("verified", "no_handler")


def test_transient_failure_backs_off_then_dies_after_max_attempts(client, push_handler, settings):
    settings.DELIVERY_MAX_ATTEMPTS = 3
    settings.DELIVERY_TRANSIENT_HORIZON_SECONDS = 0  # attempts alone (the horizon: below)
    push_handler.fail_with = RuntimeError("downstream hiccup")
    event = receive_github(client)
    raw_events_verify_batch()
    delivery = Delivery.objects.get()
    settings.DELIVERY_BACKOFF_BASE_SECONDS = 60
    for attempt in (1, 2):
        before = timezone.now()
        assert deliveries_run_due(now=timezone.now() + timedelta(days=attempt)) == 1
        delivery.refresh_from_db()
        assert (delivery.status, delivery.attempts) == ("pending", attempt)
        # full jitter: anywhere in [0, 60 s * 2^(attempt-1)] from the failure
        ceiling = timedelta(seconds=60 * 2 ** (attempt - 1))
        assert before <= delivery.next_attempt_at <= timezone.now() + ceiling
        assert "downstream hiccup" in delivery.last_error
    # Backoff is a property of the row: a delivery that is not due is not claimed.
    Delivery.objects.update(next_attempt_at=timezone.now() + timedelta(minutes=5))
    assert deliveries_run_due() == 0
    deliveries_run_due(now=timezone.now() + timedelta(days=9))
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("dead", 3)
    outcomes = list(delivery.history.values_list("outcome", flat=True))
    assert outcomes == ["transient", "transient", "dead"]
    event.refresh_from_db()
    assert event.handled_at is not None


def test_permanent_failure_is_dead_at_once(client, push_handler):
    push_handler.fail_with = PermanentHandlerError("recap 42 does not exist")
    receive_github(client)
    inbox_run_once()
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("dead", 1)
    assert delivery.last_error == "PermanentHandlerError: recap 42 does not exist"


def test_stale_processing_delivery_is_rearmed(client, push_handler, settings):
    receive_github(client)
    raw_events_verify_batch()
    stale = timedelta(seconds=settings.DELIVERY_STALE_AFTER_SECONDS + 60)
    Delivery.objects.update(status="processing", claimed_at=timezone.now() - stale, attempts=1)
    assert deliveries_rearm_orphaned() == 1
    # Its worker died: no verdict about the delivery, so the attempt is given back.
    assert Delivery.objects.get().attempts == 0
    assert Delivery.objects.get().status == "pending"
    inbox_run_once()
    assert Delivery.objects.get().status == "done"


def test_fresh_processing_delivery_is_left_alone(client, push_handler):
    receive_github(client)
    raw_events_verify_batch()
    Delivery.objects.update(status="processing", claimed_at=timezone.now())
    assert deliveries_rearm_orphaned() == 0


def test_replay_runs_the_handler_again(client, push_handler):
    event = receive_github(client)
    inbox_run_once()
    assert raw_event_replay(raw_event=event) == 1
    inbox_run_once()
    assert [call[0] for call in push_handler.calls] == [event.id, event.id]
    delivery = Delivery.objects.get()
    assert (delivery.attempts, delivery.total_attempts) == (1, 2)
    # the history keeps counting across replays
    assert list(delivery.history.values_list("number", "outcome")) == [(1, "done"), (2, "done")]


def test_replay_leaves_a_running_delivery_alone(client, push_handler):
    event = receive_github(client)
    raw_events_verify_batch()
    Delivery.objects.update(status="processing", claimed_at=timezone.now())
    assert raw_event_replay(raw_event=event) == 0
    event.refresh_from_db()
    assert event.dispatch_status == "dispatched"
    assert Delivery.objects.get().status == "processing"


def test_replay_reaches_a_handler_registered_after_arrival(client, push_handler):
    event = receive_github(client, event="star")
    inbox_run_once()
    event.refresh_from_db()
    assert event.dispatch_status == "no_handler"

    def on_star(event, payload):
        push_handler(event, payload)

    webhook_handler(provider="github", event_types=["star"])(on_star)
    try:
        assert raw_event_replay(raw_event=event) == 1
        inbox_run_once()
    finally:
        unregister(f"{on_star.__module__}.{on_star.__qualname__}")
    assert [call[0] for call in push_handler.calls] == [event.id]


def test_replay_refuses_rejected_and_duplicate_events(client, push_handler):
    rejected = receive_github(client, secret="wrong", delivery="x")
    original = receive_github(client, delivery="y")
    copy = receive_github(client, delivery="y")
    inbox_run_once()
    with pytest.raises(ReplayRefused) as refused:
        raw_event_replay(raw_event=rejected)
    assert str(refused.value) == REPLAY_NOT_VERIFIED.format(id=rejected.id, status="rejected")
    with pytest.raises(ReplayRefused) as refused:
        raw_event_replay(raw_event=copy)
    assert str(refused.value) == REPLAY_DUPLICATE.format(id=copy.id, original=original.id)


def test_reverify_after_a_secret_fix(client, push_handler, monkeypatch):
    event = receive_github(client, secret="the new secret")
    inbox_run_once()
    event.refresh_from_db()
    assert event.rejection_reason == "bad_signature"

    monkeypatch.setenv("GITHUB_WEBHOOK_SECRET", "It's a Secret to Everybody,the new secret")
    reset_sources_cache()
    try:
        raw_event_reverify(raw_event=event)
        inbox_run_once()
    finally:
        monkeypatch.undo()
        reset_sources_cache()
    event.refresh_from_db()
    assert (event.signature_status, event.matched_secret_index) == ("verified", 1)
    assert event.verify_count == 2
    assert [call[0] for call in push_handler.calls] == [event.id]
    with pytest.raises(ReverifyRefused):
        raw_event_reverify(raw_event=event)


def test_late_verification_uses_received_at(client, stripe_handler):
    """Received in time, verified 20 minutes later (a backlog): still verified."""
    signed_at = timezone.now() - timedelta(minutes=20)
    body = stripe_event("evt_late", "test.concurrency")
    response = client.post(
        "/webhooks/stripe/",
        body,
        content_type="application/json",
        **stripe_headers(body, timestamp=int(signed_at.timestamp())),
    )
    RawEvent.objects.filter(pk=response.json()["id"]).update(received_at=signed_at)
    inbox_run_once()
    event = RawEvent.objects.get()
    assert event.signature_status == "verified", event.rejection_reason
    assert event.dedup_key == "id:evt_late"
