"""Re-arm of stale rows, nightly recovery, and the services the admin console calls."""

from datetime import timedelta

import pytest
from django.core.management import call_command

from outbox.errors import (
    SIDE_EFFECT_ALREADY_DEAD,
    SIDE_EFFECT_ALREADY_DONE,
    SIDE_EFFECT_IN_FLIGHT,
    SIDE_EFFECT_REASON_REQUIRED,
    OutboxError,
)
from outbox.models import RecapSideEffect
from outbox.selectors import side_effect_depths
from outbox.services import (
    outbox_recover,
    recap_retry_render,
    render_completed_record,
    side_effect_mark_dead,
    side_effect_rearm,
    side_effects_claim,
    side_effects_rearm_orphaned,
)
from recaps.errors import RECAP_NOT_RETRYABLE, RecapStateConflict
from recaps.models import RecapStatus
from tests.recaps.factories import RecapFactory
from tests.recaps.fixtures import T0

pytestmark = pytest.mark.django_db

STALE = timedelta(minutes=15)


def test_a_stale_processing_row_goes_back_to_pending(paid_recap):
    _, side_effect = paid_recap()
    side_effects_claim(limit=1, now=T0)  # …and the worker dies
    assert side_effects_rearm_orphaned(now=T0 + STALE) == 0  # not older than 15 minutes yet
    assert side_effects_rearm_orphaned(now=T0 + STALE + timedelta(seconds=1)) == 1
    side_effect.refresh_from_db()
    assert side_effect.status == "pending" and side_effect.claimed_at is None
    # A worker's death is no verdict about the row: the attempt is given back (the
    # idempotency key makes the retry safe if the request did reach the service).
    assert side_effect.attempts == 0
    assert side_effect.history.get().outcome == "rearmed_stale"


def test_staleness_is_judged_by_claimed_at_alone(paid_recap):
    # One source of truth: the claim writes claimed_at and leaves next_attempt_at (a
    # pending row's due time) as it was; the re-arm reads claimed_at.
    _, side_effect = paid_recap(now=T0 - timedelta(minutes=5))
    side_effects_claim(limit=1, now=T0)
    side_effect.refresh_from_db()
    assert side_effect.status == "processing" and side_effect.claimed_at == T0
    assert side_effect.next_attempt_at == T0 - timedelta(minutes=5)
    RecapSideEffect.objects.filter(pk=side_effect.pk).update(next_attempt_at=T0 + STALE * 4)
    assert side_effects_rearm_orphaned(now=T0 + STALE + timedelta(seconds=1)) == 1


def test_a_late_worker_cannot_overwrite_a_rearmed_and_reclaimed_row(paid_recap):
    from kernel.retry import Disposition, Failure
    from outbox.services import side_effect_fail

    _, side_effect = paid_recap()
    (old_claim,) = side_effects_claim(limit=1, now=T0)
    side_effects_rearm_orphaned(now=T0 + STALE * 2)
    (new_claim,) = side_effects_claim(limit=1, now=T0 + STALE * 2)
    outcome = side_effect_fail(
        claim=old_claim,
        failure=Failure(Disposition.PERMANENT, error_class="http_400"),
        error="late",
        started_at=T0,
        now=T0 + STALE * 3,
    )
    side_effect.refresh_from_db()
    assert outcome == "lost_claim"
    assert side_effect.status == "processing" and side_effect.claimed_at == new_claim.claimed_at


def test_recovery_recreates_the_missing_row_and_rearms_stuck_ones(paid_recap):
    recap, side_effect = paid_recap()
    side_effect.delete()  # a paid recap whose row never got written
    _, stuck = paid_recap(now=T0 - timedelta(hours=2))
    side_effects_claim(limit=5, now=T0 - timedelta(hours=1))  # …and its worker died

    report = outbox_recover(now=T0)
    assert (report.created, report.rearmed) == (1, 1)
    assert RecapSideEffect.objects.get(recap=recap).status == "pending"
    stuck.refresh_from_db()
    assert stuck.status == "pending"
    # A second night finds nothing to do: recovery is idempotent and triggers nothing.
    assert outbox_recover(now=T0) == type(report)(created=0, rearmed=0, stuck_rendering=0)


def test_recover_recaps_command_prints_counts(paid_recap):
    recap, side_effect = paid_recap()
    side_effect.delete()
    call_command("recover_recaps")
    assert RecapSideEffect.objects.filter(recap=recap).exists()


def test_recover_recaps_command_output(paid_recap, capsys):
    _, side_effect = paid_recap()
    side_effect.delete()
    call_command("recover_recaps")
    out = capsys.readouterr().out
    assert out.startswith(
        "recover_recaps: created 1 missing side effects, re-armed 0 stale processing rows, "
        "0 recaps rendering for more than 24 h (see the console); render checks 0: "
    )


def test_recovery_counts_recaps_stuck_rendering_without_touching_them(paid_recap):
    from recaps.services import recap_mark_rendering

    recap, _ = paid_recap()
    recap_mark_rendering(recap_id=recap.id, render_id="r1", now=T0 - timedelta(days=2))
    assert outbox_recover(now=T0).stuck_rendering == 1
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING


# --- the console's services ---------------------------------------------------------------


def make_dead(paid_recap):
    recap, side_effect = paid_recap()
    side_effect_mark_dead(side_effect=side_effect, reason="render service retired", now=T0)
    recap.refresh_from_db()
    side_effect.refresh_from_db()
    return recap, side_effect


def test_mark_dead_fails_the_recap_with_the_reason_and_keeps_it_visible(paid_recap):
    recap, side_effect = make_dead(paid_recap)
    assert side_effect.status == "dead" and side_effect.last_error_class == "operator"
    assert recap.status == RecapStatus.FAILED
    assert recap.failure_reason == "marked dead by an operator: render service retired"
    with pytest.raises(OutboxError, match="already dead"):
        side_effect_mark_dead(side_effect=side_effect, reason="again")


def test_mark_dead_needs_a_reason(paid_recap):
    _, side_effect = paid_recap()
    with pytest.raises(OutboxError) as exc:
        side_effect_mark_dead(side_effect=side_effect, reason="  ")
    assert str(exc.value) == SIDE_EFFECT_REASON_REQUIRED


def test_rearm_of_a_dead_row_gives_fresh_attempts_and_reopens_the_recap(paid_recap):
    recap, side_effect = make_dead(paid_recap)
    RecapSideEffect.objects.filter(pk=side_effect.pk).update(attempts=5)
    row = side_effect_rearm(side_effect=side_effect, now=T0 + timedelta(hours=1))
    recap.refresh_from_db()
    assert (row.status, row.attempts) == ("pending", 0)
    assert row.next_attempt_at == T0 + timedelta(hours=1)
    assert row.key_generation == 0  # same request: an earlier attempt may have arrived
    assert recap.status == RecapStatus.PAID and recap.failure_reason == ""
    assert [h.outcome for h in row.history.all()] == ["marked_dead", "rearmed"]


def test_rearm_refuses_a_fresh_processing_row_and_a_done_one(paid_recap):
    _, side_effect = paid_recap()
    side_effects_claim(limit=1, now=T0)
    with pytest.raises(OutboxError) as exc:
        side_effect_rearm(side_effect=side_effect, now=T0 + timedelta(minutes=1))
    assert str(exc.value) == SIDE_EFFECT_IN_FLIGHT.format(id=side_effect.id, ttl=45)
    assert side_effect_rearm(side_effect=side_effect, now=T0 + timedelta(minutes=16))
    RecapSideEffect.objects.filter(pk=side_effect.pk).update(status="done")
    with pytest.raises(OutboxError) as exc:
        side_effect_rearm(side_effect=side_effect)
    assert str(exc.value) == SIDE_EFFECT_ALREADY_DONE.format(id=side_effect.id)
    assert SIDE_EFFECT_ALREADY_DEAD  # (message exists for mark_dead)


def test_retry_render_of_a_failed_recap_goes_through_the_same_outbox(paid_recap):
    recap, side_effect = make_dead(paid_recap)
    retried = recap_retry_render(recap=recap, now=T0 + timedelta(hours=1))
    side_effect.refresh_from_db()
    assert retried.status == RecapStatus.PAID
    assert side_effect.status == "pending" and side_effect.attempts == 0


def test_retry_render_while_rendering_is_refused_with_the_reason(paid_recap):
    """At most one render outstanding per recap (issue 27): before, retry-render on a
    `rendering` recap started a second render at once."""
    from recaps.errors import RECAP_RENDER_IN_FLIGHT
    from recaps.services import recap_mark_rendering

    recap, side_effect = paid_recap()
    RecapSideEffect.objects.filter(pk=side_effect.pk).update(status="done")
    recap_mark_rendering(recap_id=recap.id, render_id="r1", now=T0)
    with pytest.raises(RecapStateConflict) as exc:
        recap_retry_render(recap=recap, now=T0)
    assert str(exc.value) == RECAP_RENDER_IN_FLIGHT.format(
        render_id="r1", check_at=(T0 + timedelta(seconds=1500)).isoformat()
    )
    side_effect.refresh_from_db()
    recap.refresh_from_db()
    assert (side_effect.status, side_effect.key_generation) == ("done", 0)
    assert (recap.status, recap.render_id) == (RecapStatus.RENDERING, "r1")


def test_retry_render_after_the_render_failed_asks_for_a_new_render(paid_recap):
    from outbox.services import render_failed_record
    from recaps.services import recap_mark_rendering

    recap, side_effect = paid_recap()
    old_key = side_effect.idempotency_key
    RecapSideEffect.objects.filter(pk=side_effect.pk).update(status="done")
    recap_mark_rendering(recap_id=recap.id, render_id="r1", now=T0)
    render_failed_record(
        recap_id=recap.id, render_id="r1", idempotency_key=old_key, reason="render failed: x"
    )
    retried = recap_retry_render(recap=recap, now=T0)
    side_effect.refresh_from_db()
    assert retried.status == RecapStatus.PAID and retried.render_id == ""
    assert side_effect.status == "pending" and side_effect.idempotency_key != old_key


def test_retry_render_recreates_a_missing_row(paid_recap):
    recap, side_effect = paid_recap()
    side_effect.delete()
    recap_retry_render(recap=recap)
    assert RecapSideEffect.objects.get(recap=recap).status == "pending"


@pytest.mark.parametrize("status", ["pending_payment", "ready"])
def test_retry_render_refuses_unpaid_and_ready_recaps(paid_recap, status):
    if status == "ready":
        recap, side_effect = paid_recap()
        render_completed_record(
            recap_id=recap.id,
            video_url="https://v.example/1.mp4",
            render_id="r1",
            idempotency_key=side_effect.idempotency_key,
        )
    else:
        recap = RecapFactory.create()
    with pytest.raises(RecapStateConflict) as exc:
        recap_retry_render(recap=recap)
    assert str(exc.value) == RECAP_NOT_RETRYABLE


def test_side_effect_depths_for_the_queue_depth_api(paid_recap):
    for _ in range(3):
        paid_recap(now=T0)
    paid_recap(now=T0 + timedelta(hours=1))  # pending, not due yet
    make_dead(paid_recap)
    side_effects_claim(limit=1, now=T0)  # one of the due ones is now processing
    depths = side_effect_depths(now=T0 + timedelta(minutes=10))
    # `done` is volume, not depth: not counted (it would read every side effect ever made).
    assert depths == {
        "pending": 3,
        "processing": 1,
        "dead": 1,
        "due": 2,
        "stale_processing": 0,
        "oldest_due_age_seconds": 600.0,
        "oldest_waiting_age_seconds": None,
        "waiting": {
            "breaker": 0,
            "ambiguous": 0,
            "database": 0,
            "own_error": 0,
            "configuration": 0,
        },
    }
    assert side_effect_depths(now=T0)["stale_processing"] == 0
    assert side_effect_depths(now=T0 + timedelta(hours=2))["stale_processing"] == 1
