"""One bad row never blocks the others (issue 8, finding 1).

Poison rows through the real inbox on PostgreSQL: correctly signed events whose JSON holds
text PostgreSQL cannot store (a lone surrogate escape, an escaped NUL), a bug in our own code
that raises for one row, handlers whose error text cannot be stored, a handler whose writes
fail only at COMMIT — each in a batch with ordinary events of other sources, which must go
on. Transactional tests: the savepoints, the rollbacks and the deferred constraint checks
only happen for real when the inbox commits.
"""

import json
import time
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from ingress import inbox
from ingress.deliveries import deliveries_run_due
from ingress.handlers import unregister, webhook_handler
from ingress.inbox import inbox_run_once, raw_events_verify_batch
from ingress.models import Delivery, DeliveryAttempt, RawEvent, RawEventClaim
from ingress.services import raw_event_reverify, raw_event_store
from ingress.sources import all_sources
from kernel.errors import PermanentError
from tests.support.processes import app_env, start_manage
from tests.support.signing import github_headers, store_signed_stripe_event

pytestmark = pytest.mark.django_db(transaction=True)

ORDINARY_TYPE = "test.poison.ordinary"
FAILING_TYPE = "test.poison.failing"


def stripe_body(event_id: str, event_type: str, **data) -> bytes:
    # json.dumps writes a lone surrogate or a NUL as the escape a sender would put on the
    # wire ("\ud800", "\u0000"): valid JSON, valid UTF-8, correctly signed.
    return json.dumps(
        {"id": event_id, "object": "event", "type": event_type, "data": {"object": data}}
    ).encode()


def store_stripe(event_id: str, event_type: str = ORDINARY_TYPE, **data: object) -> RawEvent:
    return store_signed_stripe_event(stripe_body(event_id, event_type, **data))


def store_github(delivery: str, event: str = "push", *, form_payload: dict | None = None):
    # Distinct events, distinct bodies (the same signature again is a replay).
    body = json.dumps({"ref": "refs/heads/main", "delivery": delivery}).encode()
    content_type = "application/json"
    if form_payload is not None:  # GitHub's other content type: the JSON in a form field
        body = urlencode({"payload": json.dumps(form_payload)}).encode()
        content_type = "application/x-www-form-urlencoded"
    headers = github_headers(body, event=event, delivery=delivery)
    return raw_event_store(
        source=all_sources()["github"],
        method="POST",
        path="/webhooks/github/",
        query_string="",
        headers={
            "content-type": content_type,
            "x-hub-signature-256": headers["HTTP_X_HUB_SIGNATURE_256"],
            "x-github-event": headers["HTTP_X_GITHUB_EVENT"],
            "x-github-delivery": headers["HTTP_X_GITHUB_DELIVERY"],
        },
        body=body,
        remote_addr="127.0.0.1",
    )


class Handler:
    """A registered handler recording the events it saw; `fail` decides per event."""

    def __init__(self, provider: str, event_type: str, name: str):
        self.seen: list[int] = []
        self.fail = None

        def handle(event, payload):
            self.seen.append(event.id)
            if self.fail is not None:
                self.fail(event)

        handle.__qualname__ = name
        webhook_handler(provider=provider, event_types=[event_type])(handle)
        self.name = f"{handle.__module__}.{name}"


@pytest.fixture
def handlers():
    made = {
        "stripe": Handler("stripe", ORDINARY_TYPE, "on_stripe_ordinary"),
        "stripe_failing": Handler("stripe", FAILING_TYPE, "on_stripe_failing"),
        "github": Handler("github", "push", "on_github_push"),
    }
    yield made
    for handler in made.values():
        unregister(handler.name)


def refreshed(*events: RawEvent) -> list[RawEvent]:
    for event in events:
        event.refresh_from_db()
    return list(events)


# --- text PostgreSQL cannot store -----------------------------------------------------------


def test_signed_bodies_with_unstorable_text_are_rejected_and_the_batch_goes_on(handlers):
    before = store_github("gh-1")
    surrogate = store_stripe("evt_surrogate", "x\ud800")
    nul = store_stripe("evt_\u0000nul")
    ordinary = store_stripe("evt_ordinary")
    after = store_github("gh-2")

    assert raw_events_verify_batch() == 5

    surrogate, nul, ordinary, before, after = refreshed(surrogate, nul, ordinary, before, after)
    for poison in (surrogate, nul):
        assert (poison.signature_status, poison.rejection_reason) == ("rejected", "unstorable_text")
        assert poison.dispatch_status == "not_dispatched"
        assert poison.verified_at is not None
        assert (poison.event_type, poison.dedup_key) == ("", "")
    for event in (before, ordinary, after):
        assert (event.signature_status, event.dispatch_status) == ("verified", "dispatched")
    assert raw_events_verify_batch() == 0  # nothing left pending

    deliveries_run_due()
    assert handlers["github"].seen == [before.id, after.id]
    assert handlers["stripe"].seen == [ordinary.id]
    assert set(Delivery.objects.values_list("status", flat=True)) == {"done"}
    assert not Delivery.objects.filter(raw_event_id__in=[surrogate.id, nul.id]).exists()


def test_unstorable_text_anywhere_in_the_body_is_found_and_valid_pairs_are_not(handlers):
    deep = store_stripe("evt_deep", name="ok", nested={"list": ["fine", "\udc00 lone low"]})
    in_key = store_stripe("evt_key", ORDINARY_TYPE, **{"k\u0000ey": 1})
    emoji = store_stripe("evt_emoji", name="\U0001f600 a surrogate *pair* is fine")

    result = inbox_run_once()

    assert (result.verified, result.delivered) == (3, 1)
    deep, in_key, emoji = refreshed(deep, in_key, emoji)
    assert [deep.rejection_reason, in_key.rejection_reason] == ["unstorable_text"] * 2
    assert (emoji.signature_status, emoji.dispatch_status) == ("verified", "dispatched")
    assert handlers["stripe"].seen == [emoji.id]


def test_unstorable_text_behind_form_percent_escapes_is_found(handlers):
    hidden = store_github("gh-hidden", form_payload={"ref": "refs/heads/\u0000main"})
    plain = store_github("gh-plain", form_payload={"ref": "refs/heads/main"})
    assert b"\\u" not in bytes(hidden.body)  # "%5Cu0000": no escape to see in the bytes

    inbox_run_once()

    hidden, plain = refreshed(hidden, plain)
    assert (hidden.signature_status, hidden.rejection_reason) == ("rejected", "unstorable_text")
    assert (plain.signature_status, plain.dispatch_status) == ("verified", "dispatched")
    assert handlers["github"].seen == [plain.id]


def test_unstorable_text_past_the_check_is_still_isolated_to_its_row(handlers, monkeypatch):
    """Defence in depth: should the check miss a case, the driver refusing to encode the
    row costs that row one charged try, and the database refusing it a wait, uncharged (a
    database error is never evidence about a row) — not the batch either way."""
    monkeypatch.setattr(inbox, "holds_unstorable_text", lambda headers, body: False, raising=False)
    ordinary = store_github("gh-1")
    surrogate = store_stripe("evt_surrogate", "x\ud800")
    nul = store_stripe("evt_\u0000nul")
    now = timezone.now()

    assert raw_events_verify_batch(now=now) == 3

    ordinary, surrogate, nul = refreshed(ordinary, surrogate, nul)
    assert (ordinary.signature_status, ordinary.dispatch_status) == ("verified", "dispatched")
    for poison, error, charged in ((surrogate, "UnicodeEncodeError", 1), (nul, "DataError", 0)):
        assert (poison.signature_status, poison.processing_failures) == ("pending", charged)
        assert poison.processing_error.startswith(error), poison.processing_error
        assert poison.retry_not_before is not None and poison.retry_not_before > now
    assert not RawEventClaim.objects.exists()  # the claim over: the worker lived
    assert "evt_" not in nul.processing_error and "nul" not in nul.processing_error


def test_a_database_error_on_one_row_never_sets_it_aside(handlers, monkeypatch, settings):
    """Issue 27's rule on the settle step: however often the database refuses a row, it
    waits, uncharged, and is never rejected `processing_failed`."""
    monkeypatch.setattr(inbox, "holds_unstorable_text", lambda headers, body: False, raising=False)
    settings.INBOX_MAX_ROW_FAILURES = 2
    nul = store_stripe("evt_\u0000nul")
    now = timezone.now()
    for _ in range(4):
        assert raw_events_verify_batch(now=now) == 1
        (nul,) = refreshed(nul)
        assert nul.retry_not_before is not None
        now = nul.retry_not_before
    assert (nul.signature_status, nul.processing_failures) == ("pending", 0)


def wait_until_nothing_pending(worker, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.alive:
        if not RawEvent.objects.filter(signature_status="pending").exists():
            break
        time.sleep(0.1)
    time.sleep(0.5)  # a few more passes over the settled rows
    assert worker.alive, worker.output()[-3000:]


@pytest.mark.slow
def test_process_inbox_keeps_running_past_poison_rows(tmp_path):
    """The worker as it runs in production: a subprocess on the test database. The lone
    surrogate used to end it (exit 1, on every start); the NUL to fail every pass."""
    surrogate = store_stripe("evt_surrogate", "x\ud800")
    ordinary = [store_github("gh-1", event="ping"), store_stripe("evt_ordinary")]
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    worker = start_manage(
        ["process_inbox"],
        app_env(
            url,
            INBOX_IDLE_SLEEP_SECONDS="0.1",
            # Nothing here renders; the start-up checks only want the outbox configured.
            RENDER_SERVICE_URL="http://127.0.0.1:9/",
            RENDER_CALLBACK_URL="http://127.0.0.1:9/webhooks/renderer/",
            STRIPE_API_KEY="sk_test_eventdrop",
        ),
        log=tmp_path / "process_inbox.log",
    )
    try:
        wait_until_nothing_pending(worker)
        nul = store_stripe("evt_\u0000nul")
        ordinary.append(store_github("gh-2"))
        wait_until_nothing_pending(worker)
    finally:
        returncode = worker.stop()
    assert returncode == 0
    surrogate, nul, *ordinary = refreshed(surrogate, nul, *ordinary)
    assert [e.rejection_reason for e in (surrogate, nul)] == ["unstorable_text"] * 2
    assert [e.signature_status for e in ordinary] == ["verified"] * 3


# --- a bug in our own code ------------------------------------------------------------------


def test_a_row_our_code_fails_on_is_retried_with_backoff_then_set_aside(
    handlers, monkeypatch, settings
):
    settings.INBOX_MAX_ROW_FAILURES = 3
    settings.INBOX_ROW_RETRY_BASE_SECONDS = 30
    buggy = store_stripe("evt_buggy")
    ordinary = [store_github("gh-1"), store_stripe("evt_ordinary")]
    real_dedup_key_for = inbox.dedup_key_for

    def dedup_key_for(event, verdict):
        if verdict.provider_event_id == "evt_buggy":
            raise RuntimeError(f"a bug, with payload in its message: {bytes(event.body)!r}")
        return real_dedup_key_for(event, verdict)

    monkeypatch.setattr(inbox, "dedup_key_for", dedup_key_for)
    t0 = timezone.now()

    assert raw_events_verify_batch(now=t0) == 3
    assert [e.signature_status for e in refreshed(*ordinary)] == ["verified", "verified"]
    (buggy,) = refreshed(buggy)
    assert (buggy.signature_status, buggy.processing_failures) == ("pending", 1)
    assert buggy.retry_not_before == t0 + timedelta(seconds=30)
    assert buggy.processing_error == "RuntimeError in verify/dedup/dispatch"
    # Not due yet: the next passes leave it alone (no tight loop).
    assert raw_events_verify_batch(now=t0) == 0
    assert raw_events_verify_batch(now=t0 + timedelta(seconds=29)) == 0

    t1 = t0 + timedelta(seconds=31)
    assert raw_events_verify_batch(now=t1) == 1
    (buggy,) = refreshed(buggy)
    assert (buggy.signature_status, buggy.processing_failures) == ("pending", 2)
    assert buggy.retry_not_before == t1 + timedelta(seconds=60)  # exponential
    assert raw_events_verify_batch(now=t1 + timedelta(seconds=59)) == 0

    t2 = t1 + timedelta(seconds=61)
    assert raw_events_verify_batch(now=t2) == 1
    (buggy,) = refreshed(buggy)
    assert (buggy.signature_status, buggy.rejection_reason) == ("rejected", "processing_failed")
    assert (buggy.processing_failures, buggy.dispatch_status) == (3, "not_dispatched")
    assert buggy.processing_error == "RuntimeError in verify/dedup/dispatch"
    assert buggy.retry_not_before is None
    assert raw_events_verify_batch(now=t2 + timedelta(days=1)) == 0  # set aside for good
    assert handlers["stripe"].seen == []

    # The way out once the bug is fixed: re-verify, as for any rejection.
    monkeypatch.undo()
    raw_event_reverify(raw_event=buggy)
    deliveries_run_due()
    (buggy,) = refreshed(buggy)
    assert (buggy.signature_status, buggy.dispatch_status) == ("verified", "dispatched")
    assert buggy.id in handlers["stripe"].seen


def test_a_permanent_error_about_the_row_sets_it_aside_at_once(handlers, monkeypatch):
    """A domain error that declares itself permanent is a verdict about the row (the
    finality rule): rejected on its first failure, as kernel/retry.py decides it."""
    buggy = store_stripe("evt_malformed")
    real_dedup_key_for = inbox.dedup_key_for

    def dedup_key_for(event, verdict):
        if verdict.provider_event_id == "evt_malformed":
            raise PermanentError("no dedup key can be made of this event")
        return real_dedup_key_for(event, verdict)

    monkeypatch.setattr(inbox, "dedup_key_for", dedup_key_for)
    now = timezone.now()
    assert raw_events_verify_batch(now=now) == 1
    (buggy,) = refreshed(buggy)
    assert (buggy.signature_status, buggy.rejection_reason) == ("rejected", "processing_failed")
    assert (buggy.processing_failures, buggy.retry_not_before) == (1, None)
    assert buggy.processing_error == "PermanentError in verify/dedup/dispatch"
    assert handlers["stripe"].seen == []


# --- deliveries -----------------------------------------------------------------------------


def test_handler_errors_with_unstorable_text_are_recorded_backed_off_then_dead(handlers, settings):
    settings.DELIVERY_MAX_ATTEMPTS = 3
    settings.DELIVERY_BACKOFF_BASE_SECONDS = 60
    settings.DELIVERY_TRANSIENT_HORIZON_SECONDS = 0  # attempts alone

    def fail(event):
        raise RuntimeError(f"bug \x00 and \ud800 for #{event.id}")

    handlers["stripe_failing"].fail = fail
    failing = [store_stripe("evt_fail_1", FAILING_TYPE), store_stripe("evt_fail_2", FAILING_TYPE)]
    ordinary = store_github("gh-1")
    raw_events_verify_batch()

    now = timezone.now()
    for attempt in (1, 2, 3):
        assert deliveries_run_due(now=now) == (3 if attempt == 1 else 2)
        for delivery in Delivery.objects.filter(handler=handlers["stripe_failing"].name):
            last = delivery.history.order_by("-number").first()
            assert last is not None and last.number == attempt
            assert "bug \\x00 and \\ud800" in last.error
            assert delivery.last_error == last.error
            if attempt < 3:
                assert (delivery.status, last.outcome) == ("pending", "transient")
                # Backed off from the failure, within the ceiling of this attempt.
                ceiling = timedelta(seconds=60 * 2 ** (attempt - 1))
                assert last.finished_at < delivery.next_attempt_at <= last.finished_at + ceiling
            else:
                assert (delivery.status, last.outcome) == ("dead", "dead")
        # Nothing is claimed before its next time: the failing rows are not re-run at once.
        due = Delivery.objects.filter(status="pending").values_list("next_attempt_at", flat=True)
        if due:
            assert deliveries_run_due(now=min(due) - timedelta(microseconds=1)) == 0
            now = max(due) + timedelta(seconds=1)

    (ordinary,) = refreshed(ordinary)
    assert Delivery.objects.get(raw_event_id=ordinary.id).status == "done"
    assert sorted(handlers["stripe_failing"].seen) == [e.id for e in failing for _ in range(3)]
    assert all(e.handled_at is not None for e in refreshed(*failing))


def test_a_handler_whose_writes_fail_at_commit_does_not_stall_its_batch(handlers, settings):
    """Django's foreign keys are DEFERRABLE INITIALLY DEFERRED on PostgreSQL: a handler that
    writes a dangling reference passes its savepoint and fails the batch's COMMIT. The
    others are done; it waits alone, never charged (a database error is about us, issue 27),
    and visibly (its last error, its history, the processing lag)."""
    settings.DELIVERY_MAX_ATTEMPTS = 2

    def dangling_reference(event):
        now = timezone.now()
        DeliveryAttempt.objects.create(
            delivery_id=10**12, number=1, started_at=now, finished_at=now, outcome="done"
        )

    handlers["stripe_failing"].fail = dangling_reference
    bad = store_stripe("evt_bad", FAILING_TYPE)
    ordinary = [store_github("gh-1"), store_stripe("evt_ordinary"), store_github("gh-2")]
    raw_events_verify_batch()

    assert deliveries_run_due() == 4
    by_event = {d.raw_event_id: d for d in Delivery.objects.all()}
    assert [by_event[e.id].status for e in ordinary] == ["done"] * 3
    stuck = by_event[bad.id]
    assert (stuck.status, stuck.attempts) == ("pending", 0)
    assert stuck.last_error.startswith("IntegrityError")
    assert stuck.next_attempt_at > stuck.history.get().finished_at

    for _ in range(3):  # more often than DELIVERY_MAX_ATTEMPTS: still never dead
        deliveries_run_due(now=stuck.next_attempt_at + timedelta(seconds=1))
        stuck.refresh_from_db()
        assert (stuck.status, stuck.attempts) == ("pending", 0)
    assert set(stuck.history.values_list("outcome", flat=True)) == {"released"}
    assert stuck.waiting_since is not None
    assert not DeliveryAttempt.objects.filter(delivery_id=10**12).exists()


def test_process_inbox_refuses_to_start_with_a_row_retry_setting_that_cannot_work(settings):
    settings.INBOX_MAX_ROW_FAILURES = 0
    with pytest.raises(CommandError, match="INBOX_MAX_ROW_FAILURES"):
        call_command("process_inbox", "--once")
