"""A lost completion callback is not a one-way street (issue 9, finding 4).

The fake render service drops every callback (`callbacks: false`); a recap `rendering` past
its deadline (rendering_at + RENDER_EXPECTED_SECONDS + RENDER_CALLBACK_MARGIN_SECONDS,
compressed here to half a second) is asked about with GET /renders/<id> — by the scheduled
dispatcher task and by the nightly recovery — and reaches `ready`, or `failed` on the
service's own word. A render the service lost (404) is asked for again under the same
idempotency key, never failed (issue 27); otherwise the render is requested once.

Real HTTP against the fake (a thread in this process); the dispatcher runs inline (test
settings: RENDER_MAX_CONCURRENCY = 1). About 20 s for the module, most of it waiting out
compressed deadlines.
"""

import time

import pytest
from django.core import checks
from django.utils import timezone

from outbox.models import RecapSideEffect
from outbox.tasks import dispatch_side_effects, recover_recaps
from recaps.models import RecapStatus, RecapVideo

pytestmark = pytest.mark.django_db

DEADLINE_SECONDS = 0.5


@pytest.fixture
def compressed(settings, fake_renderer):
    """Time compressed through settings: callbacks overdue after 0.5 s, a status call cut at
    0.8 s, asked again 1.0 s after a check (consistent: outbox.E005 passes)."""
    settings.RENDER_EXPECTED_SECONDS = 0.3
    settings.RENDER_CALLBACK_MARGIN_SECONDS = 0.2
    settings.RENDER_CHECK_INTERVAL_SECONDS = 1.0
    settings.RENDER_STATUS_CONNECT_TIMEOUT_SECONDS = 0.5
    settings.RENDER_STATUS_READ_TIMEOUT_SECONDS = 0.5
    settings.RENDER_STATUS_TIMEOUT_SECONDS = 0.8
    # The service renders at once but every completion callback is lost.
    fake_renderer.configure(callbacks=False, complete_after=0.0)
    return fake_renderer


def wait_until_due(recap: RecapVideo) -> None:
    recap.refresh_from_db()
    assert recap.render_check_at is not None
    pause = (recap.render_check_at - timezone.now()).total_seconds()
    assert pause < 5, "the deadline is not compressed"
    time.sleep(max(pause, 0) + 0.05)


def rendering(paid_recap, *, dispatch=dispatch_side_effects):
    """A paid recap, dispatched by the scheduled task: accepted, now `rendering`."""
    recap, side_effect = paid_recap()
    dispatch()
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING
    return recap, side_effect


def assert_rendered_once(fake, recap: RecapVideo, side_effect: RecapSideEffect) -> None:
    side_effect.refresh_from_db()
    renders = fake.renders_for_recap(str(recap.id))
    assert [r.idempotency_key for r in renders] == [side_effect.idempotency_key]
    assert dict(fake.posts_by_key) == {side_effect.idempotency_key: 1}


# --- the required story: every callback lost, the recap still becomes ready ---------------


def test_lost_callbacks_the_dispatcher_task_makes_the_recap_ready_after_the_deadline(
    compressed, paid_recap
):
    recap, side_effect = rendering(paid_recap)
    render_id = recap.render_id

    dispatch_side_effects()  # before the deadline: nobody asks
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING

    wait_until_due(recap)
    summary = dispatch_side_effects()

    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY, summary
    assert recap.video_url == f"https://videos.eventdrop.invalid/{render_id}.mp4"
    assert recap.render_id == render_id
    assert_rendered_once(compressed, recap, side_effect)
    assert compressed.callbacks_sent == []
    assert dict(compressed.status_requests) == {render_id: 1}
    assert "render checks 1: ready 1" in summary
    side_effect.refresh_from_db()
    assert side_effect.status == "done" and side_effect.attempts == 1

    dispatch_side_effects()  # ready: never asked again, never rendered again
    assert dict(compressed.status_requests) == {render_id: 1}
    assert_rendered_once(compressed, recap, side_effect)


def test_lost_callbacks_the_nightly_recovery_covers_rendering_too(compressed, paid_recap):
    recap, side_effect = rendering(paid_recap)
    wait_until_due(recap)
    summary = recover_recaps()
    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY, summary
    assert_rendered_once(compressed, recap, side_effect)


# --- what the service answers, and what we do with it --------------------------------------


def test_the_service_reports_the_render_failed_the_recap_fails_with_its_reason(
    compressed, paid_recap
):
    compressed.configure(outcome="failed")
    recap, side_effect = rendering(paid_recap)
    wait_until_due(recap)
    dispatch_side_effects()
    recap.refresh_from_db()
    assert recap.status == RecapStatus.FAILED
    assert recap.failure_reason == (
        "render failed (reported on a status check): photos_unreadable: no photo could be decoded"
    )
    assert_rendered_once(compressed, recap, side_effect)


def test_still_rendering_is_asked_again_only_after_the_interval(compressed, paid_recap):
    from outbox.render_status import render_checks_run

    compressed.configure(complete_after=30.0)  # a slow render, not a lost one
    recap, side_effect = rendering(paid_recap)
    wait_until_due(recap)
    report = render_checks_run()
    assert report.count("rendering") == 1
    assert render_checks_run().checked == 0  # not due again yet
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING
    wait_until_due(recap)
    assert render_checks_run().count("rendering") == 1
    assert dict(compressed.status_requests) == {recap.render_id: 2}
    assert_rendered_once(compressed, recap, side_effect)


@pytest.mark.parametrize("mode", ["error_5xx", "rate_limited", "unhealthy", "down", "hang"])
def test_a_transient_failure_of_the_status_call_never_writes_a_terminal_state(
    compressed, paid_recap, mode
):
    from outbox.render_status import render_checks_run

    recap, side_effect = rendering(paid_recap)
    wait_until_due(recap)
    compressed.configure(mode=mode, delay=5.0)
    started = time.monotonic()
    report = render_checks_run()
    # Bounded by the status call's own 0.8 s deadline, whatever the service does.
    assert time.monotonic() - started < 2.0
    assert report.count("retry_later") == 1 and report.stopped_early, report.summary()
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING and recap.failure_reason == ""
    assert recap.render_check_at > timezone.now()  # asked again one interval later

    compressed.configure(mode="ok")
    wait_until_due(recap)
    assert render_checks_run().count("ready") == 1
    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY
    assert_rendered_once(compressed, recap, side_effect)


def test_a_failing_service_stops_the_run_after_one_check(compressed, paid_recap):
    from outbox.render_status import render_checks_run

    recaps = [rendering(paid_recap)[0] for _ in range(3)]
    wait_until_due(recaps[-1])
    compressed.configure(mode="error_5xx")
    report = render_checks_run()
    assert (report.checked, report.stopped_early) == (1, True)
    assert sum(compressed.status_requests.values()) == 1
    assert RecapVideo.objects.filter(status=RecapStatus.RENDERING).count() == 3


def test_a_render_the_service_lost_is_asked_for_again_with_the_same_key_never_failed(
    compressed, paid_recap
):
    """The service restarted and forgot its renders: GET /renders/<id> answers 404. That is
    no verdict (issue 27): the render request is sent again with the same idempotency key,
    the service accepts it anew, and the recap becomes ready."""
    recap, side_effect = rendering(paid_recap)
    lost = recap.render_id
    compressed.restart()
    wait_until_due(recap)
    dispatch_side_effects()  # the check asks, hears 404, and re-arms the row (same key)
    recap.refresh_from_db()
    side_effect.refresh_from_db()
    assert compressed.status_requests[lost] == 1
    assert (recap.status, recap.render_id, recap.failure_reason) == (RecapStatus.PAID, "", "")
    assert (side_effect.status, side_effect.key_generation) == ("pending", 0)
    assert side_effect.history.last().outcome == "resent"
    dispatch_side_effects()  # the dispatcher asks again, under the same key
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING and recap.render_id != lost
    assert [r.idempotency_key for r in compressed.accepted] == [side_effect.idempotency_key] * 2
    wait_until_due(recap)
    dispatch_side_effects()  # and its status says completed
    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY
    assert recap.video_url.endswith(f"/{recap.render_id}.mp4")


def test_a_deploy_answering_404_to_every_status_check_fails_nothing(compressed, paid_recap):
    # GET /renders/<id> answers 404 from a deploy's default backend: asked for again, and
    # the POST answering 404 too just waits — no recap ever fails for it.
    recap, side_effect = rendering(paid_recap)
    compressed.configure(mode="answer", status=404)
    wait_until_due(recap)
    for _ in range(3):
        dispatch_side_effects()
    recap.refresh_from_db()
    side_effect.refresh_from_db()
    assert recap.status == RecapStatus.PAID and recap.failure_reason == ""
    assert (side_effect.status, side_effect.attempts) == ("pending", 0)
    assert side_effect.last_error_class == "http_404"
    compressed.configure(mode="ok")
    RecapSideEffect.objects.filter(pk=side_effect.pk).update(next_attempt_at=timezone.now())
    from outbox.models import CircuitBreaker

    CircuitBreaker.objects.update(state="closed", open_until=None)  # the cool-down, skipped
    dispatch_side_effects()
    recap.refresh_from_db()
    # Same key: the service still had the render, and answers with it.
    assert recap.status == RecapStatus.RENDERING
    assert len(compressed.accepted) == 1


def test_an_answer_for_a_render_that_moved_on_changes_nothing(compressed, paid_recap):
    """Between the claim and the answer the callback arrived, or the render failed and an
    operator asked for a new one: the late answer must not overwrite that."""
    from outbox.render_client import RenderStatus
    from outbox.services import (
        recap_retry_render,
        render_completed_record,
        render_failed_record,
        render_lost_resend,
        render_status_record,
    )

    recap, side_effect = rendering(paid_recap)
    old_render = recap.render_id
    render_failed_record(
        recap_id=recap.id,
        render_id=old_render,
        idempotency_key=side_effect.idempotency_key,
        reason="render failed: x",
    )
    recap_retry_render(recap=recap)  # operator: a new render, under a new key
    failed = RenderStatus(render_id=old_render, state="failed", error_code="x")
    assert render_status_record(recap_id=recap.id, status=failed) == "moved_on"
    assert not render_lost_resend(recap_id=recap.id, render_id=old_render)
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID

    other, other_row = rendering(paid_recap)
    render_completed_record(
        recap_id=other.id,
        video_url="https://v.invalid/1.mp4",
        render_id=other.render_id,
        idempotency_key=other_row.idempotency_key,
    )
    done = RenderStatus(render_id=other.render_id, state="failed")
    assert render_status_record(recap_id=other.id, status=done) == "moved_on"
    other.refresh_from_db()
    assert other.status == RecapStatus.READY


def test_two_check_runs_never_ask_about_the_same_render_at_once(compressed, paid_recap):
    from recaps.services import recaps_claim_render_checks

    recap, _ = rendering(paid_recap)
    wait_until_due(recap)
    (claim,) = recaps_claim_render_checks(limit=10)
    assert claim.render_id == recap.render_id
    assert recaps_claim_render_checks(limit=10) == []  # next check one interval later


# --- budgets and checks ----------------------------------------------------------------------


def test_a_run_never_starts_a_check_its_budget_cannot_cover(compressed, paid_recap):
    from outbox.render_status import render_checks_run

    recap, _ = rendering(paid_recap)
    wait_until_due(recap)
    report = render_checks_run(budget_seconds=0.5)  # one check may take 0.8 s
    assert report.checked == 0 and compressed.status_requests == {}
    recap.refresh_from_db()
    assert recap.render_check_at <= timezone.now()  # still due: nothing was claimed


def test_check_holds_the_status_worst_case_against_the_check_budget(settings):
    from outbox.checks import check_time_budgets

    settings.RENDER_CHECK_BUDGET_SECONDS = 2.0
    messages = [m for m in check_time_budgets() if m.id == "outbox.E001"]
    assert [m.msg for m in messages] == [
        "render.status worst case status 3.0 s = 3.0 s exceeds the 2.0 s budget of the "
        "render check run (RENDER_CHECK_BUDGET_SECONDS)."
    ]


def test_check_fails_when_a_scheduled_task_cannot_finish_dispatch_and_checks(settings):
    from outbox.checks import check_time_budgets

    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 70}  # 60 s dispatch + 20 s checks
    (message,) = [m for m in check_time_budgets() if m.id == "outbox.E002"]
    assert "60.0 s dispatch + 20.0 s render checks = 80.0 s" in message.msg


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"RENDER_EXPECTED_SECONDS": 0.0}, "RENDER_EXPECTED_SECONDS must be positive"),
        ({"RENDER_CALLBACK_MARGIN_SECONDS": -1.0}, "must not be negative"),
        ({"RENDER_CHECK_INTERVAL_SECONDS": 0.0}, "RENDER_CHECK_INTERVAL_SECONDS must be"),
        (
            {"RENDER_EXPECTED_SECONDS": 80000.0, "RENDER_CALLBACK_MARGIN_SECONDS": 7000.0},
            "expected 80000.0 s + margin 7000.0 s = 87000.0 s) must be shorter than "
            "RECAP_STUCK_RENDERING_HOURS (86400 s)",
        ),
    ],
)
def test_check_refuses_a_rendering_deadline_that_makes_no_sense(settings, overrides, fragment):
    from outbox.checks import check_rendering_deadline

    for name, value in overrides.items():
        setattr(settings, name, value)
    (message,) = check_rendering_deadline()
    assert message.id == "outbox.E005" and message.level == checks.ERROR
    assert fragment in message.msg


def test_check_refuses_an_interval_shorter_than_one_check(settings):
    from outbox.checks import check_rendering_deadline

    settings.RENDER_CHECK_INTERVAL_SECONDS = 3.0
    (message,) = check_rendering_deadline()
    assert message.msg == (
        "RENDER_CHECK_INTERVAL_SECONDS (3.0 s) must exceed one status check's worst case "
        "(status 3.0 s = 3.0 s)."
    )


def test_the_defaults_and_the_compressed_test_settings_pass_the_deadline_checks(compressed):
    from outbox.checks import check_rendering_deadline

    assert check_rendering_deadline() == []


def test_the_defaults_pass_the_deadline_checks():
    from outbox.checks import check_rendering_deadline

    assert check_rendering_deadline() == []


def test_a_recap_deleted_while_its_render_is_asked_about_ends_the_check_quietly(
    compressed, paid_recap
):
    from outbox.render_client import RenderClient
    from outbox.render_status import render_checks_run

    recap, _ = rendering(paid_recap)
    wait_until_due(recap)

    class DeletesFirst(RenderClient):
        def render_status(self, **kwargs):
            RecapVideo.objects.filter(pk=recap.pk).delete()
            return super().render_status(**kwargs)

    report = render_checks_run(client_factory=DeletesFirst)
    assert (report.checked, report.count("moved_on"), report.errors) == (1, 1, 0)


@pytest.mark.slow  # starts the command (tests/conftest.py)
@pytest.mark.django_db(transaction=True)
def test_lost_callbacks_through_the_dispatcher_command_as_it_runs_in_production(
    compressed, paid_recap
):
    """`dispatch_side_effects --once` in a clean environment (its own process, compressed
    settings): the first run has the render accepted, a run after the deadline asks."""
    from django.conf import settings

    from tests.support.processes import app_env, manage

    db = settings.DATABASES["default"]
    env = app_env(
        f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        RENDER_SERVICE_URL=compressed.url,
        RENDER_EXPECTED_SECONDS="0.3",
        RENDER_CALLBACK_MARGIN_SECONDS="0.2",
        RENDER_CHECK_INTERVAL_SECONDS="1.0",
        RENDER_STATUS_TIMEOUT_SECONDS="0.8",
        RENDER_STATUS_CONNECT_TIMEOUT_SECONDS="0.5",
        RENDER_STATUS_READ_TIMEOUT_SECONDS="0.5",
    )

    def dispatch_once() -> str:
        return manage("dispatch_side_effects", "--once", env=env, timeout=60).stdout

    recap, side_effect = paid_recap()
    assert "claimed 1: done 1" in dispatch_once()
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING
    wait_until_due(recap)
    out = dispatch_once()
    assert "render checks 1: ready 1" in out, out
    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY
    assert_rendered_once(compressed, recap, side_effect)
    assert compressed.callbacks_sent == []
