"""The dispatcher against the real fake render service: every path of the error contract."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from outbox.dispatcher import dispatch_run
from outbox.models import AttemptOutcome, RecapSideEffect
from outbox.render_client import RenderClient
from outbox.services import render_completed_record
from recaps.models import Photo, RecapStatus, RecapVideo
from tests.recaps.fixtures import T0

pytestmark = pytest.mark.django_db


def run(at=T0, **kwargs):
    return dispatch_run(now=at, **kwargs)


def reload(*objects):
    for obj in objects:
        obj.refresh_from_db()


def outcomes(side_effect):
    return list(side_effect.history.values_list("outcome", flat=True))


def test_accepted_render_marks_the_row_done_and_the_recap_rendering(fake_renderer, paid_recap):
    recap, side_effect = paid_recap()
    report = run()
    reload(recap, side_effect)
    assert report.claimed == 1 and report.count(AttemptOutcome.DONE) == 1
    assert side_effect.status == "done" and side_effect.attempts == 1
    assert recap.status == RecapStatus.RENDERING
    assert recap.render_id == fake_renderer.renders[side_effect.idempotency_key].render_id
    # The idempotency key is the row's, and the remaining deadline travelled with the call.
    assert fake_renderer.posts_by_key == {side_effect.idempotency_key: 1}
    assert 0 < fake_renderer.deadlines_ms[0] <= 2000
    render = fake_renderer.renders[side_effect.idempotency_key]
    assert render.recap_id == str(recap.id) and render.photos == 6
    assert outcomes(side_effect) == [AttemptOutcome.DONE]


def test_recaps_and_photos_are_read_once_per_claimed_batch(fake_renderer, paid_recap):
    # One slot runs inline (this thread's connection) and claims two rows per batch
    # (its slot and one ahead): six rows are three batches, so three photo reads, not six.
    pairs = [paid_recap() for _ in range(6)]
    with CaptureQueriesContext(connection) as queries:
        report = run(max_concurrency=1)
    assert report.count(AttemptOutcome.DONE) == 6
    selects = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    photo_table, recap_table = (
        f'FROM "{Photo._meta.db_table}"',
        f'FROM "{RecapVideo._meta.db_table}"',
    )
    assert sum(photo_table in sql for sql in selects) == 3
    assert sum(recap_table in sql for sql in selects) == 3
    for recap, side_effect in pairs:
        assert fake_renderer.renders[side_effect.idempotency_key].recap_id == str(recap.id)
        assert fake_renderer.renders[side_effect.idempotency_key].photos == 6


def test_one_run_dispatches_the_whole_backlog_not_one_recap(fake_renderer, paid_recap):
    pairs = [paid_recap() for _ in range(12)]
    report = run()
    assert report.claimed == 12 and report.count(AttemptOutcome.DONE) == 12
    assert RecapSideEffect.objects.filter(status="done").count() == 12
    assert len(fake_renderer.renders) == 12
    assert {r.recap_id for r in fake_renderer.renders.values()} == {str(r.id) for r, _ in pairs}


@pytest.mark.parametrize(
    ("mode", "error_class"),
    [
        # No health precheck while the breaker is closed: the render request answers 503.
        ("unhealthy", "http_503"),
        ("down", "connection_error"),
        ("error_5xx", "http_500"),
        ("hang", "read_timeout"),
        ("slow", "read_timeout"),
        ("drip", "deadline_exceeded"),
        ("rate_limited", "http_429"),
    ],
)
def test_answers_about_the_service_never_charge_the_row_nor_fail_the_recap(
    fake_renderer, paid_recap, mode, error_class
):
    fake_renderer.configure(mode=mode, delay=3.0, drip_interval=0.1, retry_after=120)
    recap, side_effect = paid_recap()
    report = run()
    reload(recap, side_effect)
    assert report.count(AttemptOutcome.SERVICE_UNAVAILABLE) == 1
    assert (side_effect.status, side_effect.attempts) == ("pending", 0)
    assert side_effect.last_error_class == error_class
    assert side_effect.wait_reason == "breaker"
    assert side_effect.first_failed_at is None and side_effect.waiting_since == T0
    # Nothing has proven the service healthy: the breaker opens, the row waits a cool-down.
    assert report.breaker == "open"
    assert side_effect.next_attempt_at >= T0 + timedelta(seconds=60)
    assert recap.status == RecapStatus.PAID and recap.failure_reason == ""
    assert outcomes(side_effect) == [AttemptOutcome.SERVICE_UNAVAILABLE]


def test_retry_after_is_honoured(fake_renderer, paid_recap):
    fake_renderer.configure(mode="rate_limited", retry_after=600)
    _, side_effect = paid_recap()
    run()
    side_effect.refresh_from_db()
    assert side_effect.next_attempt_at >= T0 + timedelta(seconds=600)


def test_a_slow_drip_is_cut_at_the_call_deadline_not_the_read_timeout(fake_renderer, paid_recap):
    # Every byte arrives within the 1.0 s read timeout; the whole answer would take ~7 s.
    fake_renderer.configure(mode="drip", drip_interval=0.1)
    _, side_effect = paid_recap()
    started = time.monotonic()
    run()
    elapsed = time.monotonic() - started
    side_effect.refresh_from_db()
    assert side_effect.last_error_class == "deadline_exceeded"
    assert elapsed < 2.0 + 1.0  # the render call's 2.0 s deadline, with scheduling slack


@pytest.mark.parametrize(
    ("setup", "error_class", "calls"),
    [
        ("error_4xx", "http_422", 1),
        ("too_few_photos", "too_few_photos", 0),
        ("event_deleted", "event_not_found", 0),
    ],
)
def test_permanent_failures_are_dead_at_once_and_fail_the_recap_with_the_reason(
    fake_renderer, paid_recap, settings, setup, error_class, calls
):
    recap, side_effect = paid_recap(photos=2 if setup == "too_few_photos" else None)
    if setup == "error_4xx":
        fake_renderer.configure(mode="error_4xx")
    elif setup == "event_deleted":
        recap.event.delete()
    report = run()
    reload(recap, side_effect)
    assert report.count(AttemptOutcome.PERMANENT) == 1
    assert side_effect.status == "dead" and side_effect.last_error_class == error_class
    assert recap.status == RecapStatus.FAILED
    assert error_class in recap.failure_reason
    assert sum(fake_renderer.posts_by_key.values()) == calls


def test_a_missing_configuration_never_kills_a_row_it_is_released_uncharged(
    fake_renderer, paid_recap, settings
):
    # The dispatcher refuses to start without it (outbox/configuration.py); a row that
    # meets it anyway — configuration changed under a running process — only waits.
    settings.RENDER_SERVICE_URL = ""
    recap, side_effect = paid_recap()
    report = run()
    reload(recap, side_effect)
    assert report.count(AttemptOutcome.DEFERRED) == 1
    assert (side_effect.status, side_effect.attempts) == ("pending", 0)
    assert side_effect.wait_reason == "configuration"
    assert side_effect.last_error_class == "not_configured"
    assert recap.status == RecapStatus.PAID and recap.failure_reason == ""
    assert outcomes(side_effect) == [AttemptOutcome.DEFERRED]


def test_too_few_photos_reason_names_the_counts(fake_renderer, paid_recap):
    recap, _ = paid_recap(photos=2)
    run()
    recap.refresh_from_db()
    assert "The event has 2 photos; a recap needs at least 5." in recap.failure_reason


def test_an_unclassified_error_is_retried_charged_and_ends_dead_visibly(
    fake_renderer, paid_recap, settings
):
    # One table for deliveries and side effects: what nobody classified is retried, charged,
    # a bounded number of times, then dead with its class name — never final at once.
    settings.OUTBOX_TRANSIENT_HORIZON_SECONDS = 0

    class Exploding(RenderClient):
        def request_render(self, **kwargs):
            raise ValueError("something nobody classified yet")

    recap, side_effect = paid_recap()
    run(client_factory=Exploding)
    reload(recap, side_effect)
    assert (side_effect.status, side_effect.attempts) == ("pending", 1)
    assert side_effect.last_error_class == "unclassified:ValueError"
    assert recap.status == RecapStatus.PAID
    at = T0
    for _ in range(4):
        at = side_effect.next_attempt_at + timedelta(seconds=1)
        run(at, client_factory=Exploding)
        reload(recap, side_effect)
    assert (side_effect.status, side_effect.attempts) == ("dead", 5)
    assert recap.status == RecapStatus.FAILED
    assert "unclassified:ValueError" in recap.failure_reason


def test_a_5xx_outage_of_any_length_never_kills_the_row_and_it_renders_after(
    fake_renderer, paid_recap, settings
):
    # Before issue 27 five charged 5xx answers (and the horizon) killed the recap. A 5xx is
    # an answer about the service: the row waits uncharged, once per cool-down while nothing
    # proves the service healthy, and renders once it is.
    settings.OUTBOX_TRANSIENT_HORIZON_SECONDS = 0
    fake_renderer.configure(mode="error_5xx")
    recap, side_effect = paid_recap()
    at = T0
    for _ in range(12):  # more than twice OUTBOX_MAX_ATTEMPTS, an hour apart
        run(at)
        reload(recap, side_effect)
        assert (side_effect.status, side_effect.attempts) == ("pending", 0)
        assert recap.status == RecapStatus.PAID
        at = side_effect.next_attempt_at + timedelta(hours=1)
    assert set(outcomes(side_effect)) == {AttemptOutcome.SERVICE_UNAVAILABLE}
    assert side_effect.waiting_since == T0  # the oldest wait, for the alert
    fake_renderer.configure(mode="ok")
    run(at)
    reload(recap, side_effect)
    assert (side_effect.status, side_effect.attempts) == ("done", 1)
    assert recap.status == RecapStatus.RENDERING and side_effect.waiting_since is None


def test_each_row_is_tried_once_per_run_even_with_a_zero_backoff(
    fake_renderer, paid_recap, monkeypatch
):
    class Exploding(RenderClient):
        def request_render(self, **kwargs):
            raise ValueError("our bug on this row")

    monkeypatch.setattr("kernel.retry.random.uniform", lambda a, b: 0.0)
    _, side_effect = paid_recap()
    run(client_factory=Exploding)
    side_effect.refresh_from_db()
    assert side_effect.attempts == 1 and side_effect.next_attempt_at == T0


def test_an_ambiguous_timeout_then_a_retry_renders_once(fake_renderer, paid_recap):
    # The service accepts the render but answers after our read timeout: we cannot tell
    # whether it arrived. The retry carries the same idempotency key.
    fake_renderer.configure(mode="slow", delay=2.5)
    recap, side_effect = paid_recap()
    run()
    side_effect.refresh_from_db()
    assert side_effect.status == "pending" and side_effect.last_error_class == "read_timeout"
    assert len(fake_renderer.renders) == 1  # it did arrive

    fake_renderer.configure(mode="ok")
    run(side_effect.next_attempt_at + timedelta(seconds=1))
    reload(recap, side_effect)
    assert side_effect.status == "done"
    assert fake_renderer.posts_by_key[side_effect.idempotency_key] == 2
    assert len(fake_renderer.renders_for_recap(str(recap.id))) == 1
    assert recap.render_id == fake_renderer.renders[side_effect.idempotency_key].render_id


def test_a_recap_already_ready_is_not_sent_again(fake_renderer, paid_recap):
    recap, side_effect = paid_recap()
    # The callback of an earlier (ambiguous) attempt arrived while the row waited.
    RecapSideEffect.objects.filter(pk=side_effect.pk).update(status="pending")
    render_completed_record(
        recap_id=recap.id,
        video_url="https://v.example/x.mp4",
        render_id="r1",
        idempotency_key=side_effect.idempotency_key,
    )
    RecapSideEffect.objects.filter(pk=side_effect.pk).update(status="pending")
    run()
    reload(recap, side_effect)
    assert side_effect.status == "done" and recap.status == RecapStatus.READY
    assert fake_renderer.posts_by_key == {}


def test_the_run_claims_only_while_a_worst_case_dispatch_fits(fake_renderer, paid_recap):
    paid_recap()
    # Worst case with the fixture's limits: health 2.0 s + 1 x render 2.0 s = 4.0 s.
    assert run(budget_seconds=3.95).claimed == 0
    assert run(budget_seconds=4.5).claimed == 1


def test_a_budget_cut_run_leaves_the_rest_for_the_next(fake_renderer, paid_recap):
    for _ in range(5):
        paid_recap()
    offset = [0.0]

    def clock():
        return time.monotonic() + offset[0]

    class FiveSecondClient(RenderClient):
        """Every dispatch 'takes' five seconds of the run's clock."""

        def request_render(self, **kwargs):
            accepted = super().request_render(**kwargs)
            offset[0] += 5.0
            return accepted

    # 14.5 s budget, 4 s worst case: claims at 0, 5 and 10 s fit; at 15 s nothing is left.
    report = run(budget_seconds=14.5, clock=clock, client_factory=FiveSecondClient)
    assert report.claimed == 3 and report.count(AttemptOutcome.DONE) == 3
    assert RecapSideEffect.objects.filter(status="pending").count() == 2


def test_dispatch_side_effects_once_prints_the_run(fake_renderer, paid_recap, capsys):
    from django.core.management import call_command

    paid_recap(now=T0 - timedelta(minutes=1))
    call_command("dispatch_side_effects", "--once")
    out = capsys.readouterr().out
    assert out.startswith("dispatch_side_effects: claimed 1: done 1, retry later 0, dead 0, ")
    assert "of 60.0 s budget (worst-case dispatch 4.0 s)" in out


def test_the_scheduled_tasks_run_the_dispatcher_and_the_recovery(fake_renderer, paid_recap):
    from outbox.tasks import dispatch_side_effects, recover_recaps

    paid_recap(now=T0 - timedelta(minutes=1))
    assert dispatch_side_effects().startswith("claimed 1: done 1")
    assert recover_recaps().startswith("created 0 missing side effects")
