"""console.jobs.services: preview, start, batches, cancel, resume, re-run and the replay SLO."""

import hashlib
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from console.jobs import services as bulk_jobs
from console.jobs.services import (
    ALREADY_FINISHED,
    NOT_A_FILTER,
    NOT_PREVIEWED,
    NOTHING_SELECTED,
    BulkJobError,
    bulk_job_cancel,
    bulk_job_measure_slo,
    bulk_job_preview,
    bulk_job_run,
    bulk_job_start,
    bulk_jobs_measure_slo,
    bulk_jobs_resume_stale,
    replay_slo,
    slo_measurement,
)
from console.models import BulkJob, BulkJobItem, OperatorAction
from ingress.deliveries import deliveries_run_due
from ingress.models import Delivery, DeliveryAttempt, RawEvent

pytestmark = pytest.mark.django_db


def stored_events(count: int, *, source: str = "github", event_type: str = "push", **fields):
    """Verified events as the inbox leaves them when no handler was registered, in bulk."""
    now = timezone.now()
    rows = [
        RawEvent(
            source=source,
            provider=source,
            method="POST",
            path=f"/webhooks/{source}/",
            headers={"content-type": "application/json"},
            body=b'{"n": %d}' % n,
            body_sha256=hashlib.sha256(b"%d" % n).hexdigest(),
            received_at=now - timedelta(seconds=count - n),
            signature_status=fields.get("signature_status", "verified"),
            rejection_reason=fields.get("rejection_reason", ""),
            verified_at=now,
            event_type=event_type,
            dedup_key=f"id:{source}-{event_type}-{n}-{now.timestamp()}",
            dispatch_status=fields.get("dispatch_status", "no_handler"),
        )
        for n in range(count)
    ]
    return RawEvent.objects.bulk_create(rows, batch_size=2000)


@pytest.fixture
def replays(monkeypatch):
    """Every id handed to the batch replay service, in call order."""
    calls: list[int] = []
    real = bulk_jobs.raw_events_replay_batch

    def spy(*, raw_event_ids, force=False):
        calls.extend(raw_event_ids)
        return real(raw_event_ids=raw_event_ids, force=force)

    monkeypatch.setattr(bulk_jobs, "raw_events_replay_batch", spy)
    return calls


def test_preview_counts_and_breaks_down_without_touching_anything(operator, push_handler):
    stored_events(5)
    stored_events(3, event_type="issues")
    stored_events(2, source="stripe", event_type="charge.succeeded")
    stored_events(4, signature_status="rejected", rejection_reason="bad_signature")

    job = bulk_job_preview(
        actor=operator, kind="replay_raw_events", via="api", filters={"source": "github"}
    )

    assert (job.state, job.total, job.started_at) == ("previewed", 12, None)
    assert job.breakdown["eligible"] == 8  # the rejected four would be refused
    assert dict(map(tuple, job.breakdown["by"]["event type"])) == {"push": 9, "issues": 3}
    assert dict(map(tuple, job.breakdown["by"]["status"])) == {"verified": 8, "rejected": 4}
    assert not Delivery.objects.exists() and not OperatorAction.objects.exists()

    narrowed = bulk_job_preview(
        actor=operator,
        kind="replay_raw_events",
        via="api",
        filters={"source": "github", "event_type": "push", "status": "verified"},
    )
    assert narrowed.total == 5


def test_preview_bounds_the_selection_to_what_existed(operator, push_handler):
    stored_events(3)
    job = bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={})
    stored_events(4)  # arriving after the preview: not what the operator saw
    bulk_job_start(job=job, actor=operator, via="api")
    job = bulk_job_run(job_id=job.id)
    assert (job.state, job.processed, job.succeeded) == ("done", 3, 3)
    assert Delivery.objects.count() == 3


def test_preview_refuses_what_cannot_be_run(operator):
    with pytest.raises(BulkJobError) as empty:
        bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={})
    assert str(empty.value) == NOTHING_SELECTED
    with pytest.raises(BulkJobError) as wrong:
        bulk_job_preview(
            actor=operator, kind="rearm_side_effects", via="api", filters={"handler": "x"}
        )
    assert str(wrong.value) == NOT_A_FILTER.format(name="handler", kind="rearm_side_effects")
    assert wrong.value.field == "handler"
    stored_events(1)
    with pytest.raises(BulkJobError) as unknown:
        bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", target_ids=[10**12])
    assert unknown.value.field == "ids"
    assert not BulkJob.objects.exists()


def test_a_job_runs_in_batches_and_records_one_operator_action(operator, push_handler, replays):
    events = stored_events(23)
    rejected = stored_events(2, signature_status="rejected", rejection_reason="bad_signature")
    job = bulk_job_preview(actor=operator, kind="replay_raw_events", via="admin", filters={})
    job = bulk_job_start(job=job, actor=operator, via="admin")
    assert job.state == "queued" and job.started_at is not None

    job = bulk_job_run(job_id=job.id, batch_size=10)

    assert (job.state, job.batches, job.processed) == ("done", 3, 25)
    assert (job.succeeded, job.refused, job.failed) == (23, 2, 0)
    assert sorted(replays) == sorted(e.id for e in events + rejected)  # each once
    assert Delivery.objects.filter(status="pending").count() == 23
    assert BulkJobItem.objects.filter(job=job).count() == 23
    action = OperatorAction.objects.get()
    assert action == job.operator_action
    assert (action.action, action.via, action.outcome) == ("raw_event_replay", "admin", "partial")
    assert (action.requested, action.succeeded, action.refused, action.skipped) == (25, 23, 2, 0)
    assert [item["outcome"] for item in action.results] == ["refused", "refused"]


def test_cancel_stops_between_batches_and_a_rerun_does_nothing_twice(
    operator, push_handler, replays, monkeypatch
):
    stored_events(40)
    job = bulk_job_start(
        job=bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={}),
        actor=operator,
        via="api",
    )
    # The operator cancels while the second batch runs: it finishes, the third never starts.
    real_replay = bulk_jobs._replay
    calls = []

    def replay_then_cancel(ids):
        calls.append(ids)
        if len(calls) == 2:
            bulk_job_cancel(job=job, actor=operator)
        return real_replay(ids)

    monkeypatch.setitem(bulk_jobs.ACTS, "replay_raw_events", replay_then_cancel)
    job = bulk_job_run(job_id=job.id, batch_size=10)
    monkeypatch.setitem(bulk_jobs.ACTS, "replay_raw_events", real_replay)

    assert (job.state, job.processed, job.batches) == ("cancelled", 20, 2)
    assert len(replays) == 20
    action = OperatorAction.objects.get(bulk_job=job)
    assert (action.outcome, action.requested, action.succeeded, action.skipped) == (
        "cancelled",
        40,
        20,
        20,
    )
    assert "cancel requested by operator" in action.note

    # Run again (a duplicate task message, a sweep): a finished job stays as it is.
    assert bulk_job_run(job_id=job.id, batch_size=10).processed == 20
    assert len(replays) == 20
    with pytest.raises(BulkJobError) as again:
        bulk_job_cancel(job=job, actor=operator)
    assert str(again.value) == ALREADY_FINISHED.format(id=job.id, state="cancelled")
    with pytest.raises(BulkJobError) as restart:
        bulk_job_start(job=job, actor=operator, via="api")
    assert str(restart.value) == NOT_PREVIEWED.format(id=job.id, state="cancelled")
    assert Delivery.objects.count() == 20


def test_a_database_failure_leaves_the_job_running_and_the_next_run_resumes_at_the_cursor(
    operator, push_handler, replays, monkeypatch
):
    events = stored_events(30)
    job = bulk_job_start(
        job=bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={}),
        actor=operator,
        via="api",
    )
    real_replay = bulk_jobs._replay
    calls = []

    def fail_in_the_second_batch(ids):
        calls.append(ids)
        result = real_replay(ids)
        if len(calls) == 2:
            raise OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setitem(bulk_jobs.ACTS, "replay_raw_events", fail_in_the_second_batch)
    with pytest.raises(OperationalError):
        bulk_job_run(job_id=job.id, batch_size=10)
    job.refresh_from_db()
    # Transient: no terminal state; the second batch's work rolled back with it.
    assert (job.state, job.processed, job.cursor) == ("running", 10, events[9].id)
    assert Delivery.objects.count() == 10

    monkeypatch.setitem(bulk_jobs.ACTS, "replay_raw_events", real_replay)
    job = bulk_job_run(job_id=job.id, batch_size=10)
    assert (job.state, job.processed, job.succeeded) == ("done", 30, 30)
    assert Delivery.objects.count() == 30
    # The rolled-back batch is done again, nothing else: 10 + 10 (rolled back) + 10 + 10.
    assert len(replays) == 40 and sorted(set(replays)) == sorted(e.id for e in events)
    assert BulkJobItem.objects.filter(job=job).count() == 30


def test_a_row_that_raises_is_counted_and_the_job_goes_on(operator, push_handler, monkeypatch):
    events = stored_events(6)
    real_replay = bulk_jobs._replay

    def one_poison_row(ids):
        if events[2].id in ids:
            raise ValueError("a bug")
        return real_replay(ids)

    monkeypatch.setitem(bulk_jobs.ACTS, "replay_raw_events", one_poison_row)
    job = bulk_job_start(
        job=bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={}),
        actor=operator,
        via="api",
    )
    job = bulk_job_run(job_id=job.id, batch_size=4)
    assert (job.state, job.succeeded, job.failed) == ("done", 5, 1)
    assert job.problems[0]["id"] == events[2].id
    assert "ValueError" in job.problems[0]["detail"] and "a bug" not in job.problems[0]["detail"]


def test_a_job_whose_heartbeat_stopped_is_enqueued_again(operator, push_handler, monkeypatch):
    stored_events(3)
    job = bulk_job_start(
        job=bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={}),
        actor=operator,
        via="api",
    )
    enqueued: list[int] = []
    monkeypatch.setattr(bulk_jobs, "_enqueue", enqueued.append)
    assert bulk_jobs_resume_stale() == []
    later = timezone.now() + timedelta(seconds=181)
    assert bulk_jobs_resume_stale(now=later) == [job.id]
    assert enqueued == [job.id]


def test_the_task_budget_enqueues_a_continuation(operator, push_handler, monkeypatch):
    stored_events(5)
    job = bulk_job_start(
        job=bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={}),
        actor=operator,
        via="api",
    )
    enqueued: list[int] = []
    monkeypatch.setattr(bulk_jobs, "_enqueue", enqueued.append)
    job = bulk_job_run(job_id=job.id, batch_size=2, budget_seconds=0)
    assert (job.state, job.processed, enqueued) == ("running", 2, [job.id])


def test_side_effects_are_rearmed_as_a_job(operator, dead_side_effect):
    job = bulk_job_preview(
        actor=operator, kind="rearm_side_effects", via="api", filters={"status": "dead"}
    )
    assert job.total == 1
    job = bulk_job_run(job_id=bulk_job_start(job=job, actor=operator, via="api").id)
    dead_side_effect.refresh_from_db()
    assert (job.state, job.succeeded, dead_side_effect.status) == ("done", 1, "pending")
    assert OperatorAction.objects.get(bulk_job=job).action == "side_effect_rearm"


def test_slo_nearest_rank_with_unhandled_rows_last():
    assert slo_measurement([1.0] * 99 + [None], window_seconds=120).p99_seconds == 1.0
    assert slo_measurement([1.0] * 98 + [None, None], window_seconds=120).p99_seconds is None
    measured = slo_measurement([10.0, 130.0, None], window_seconds=120)
    assert (measured.events, measured.within) == (3, 1)


def test_the_replay_slo_is_measured_from_the_click_to_the_first_done_attempt(
    operator, push_handler
):
    stored_events(4)
    job = bulk_job_start(
        job=bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={}),
        actor=operator,
        via="api",
    )
    job = bulk_job_run(job_id=job.id)
    # Three handled by the inbox now, the fourth left waiting.
    waiting = Delivery.objects.order_by("-id")[0]
    Delivery.objects.filter(pk=waiting.pk).update(next_attempt_at=timezone.now() + timedelta(1))
    assert deliveries_run_due() == 3
    assert DeliveryAttempt.objects.filter(outcome="done").count() == 3

    # Not measured before the window has passed.
    assert bulk_jobs_measure_slo() == 0
    assert job.started_at is not None
    later = job.started_at + timedelta(seconds=121)
    assert bulk_jobs_measure_slo(now=later) == 1
    job.refresh_from_db()
    assert (job.slo_events, job.slo_within, job.slo_p99_seconds) == (4, 3, None)
    figure = replay_slo(now=later, window=timedelta(hours=24))
    assert (figure.events, figure.within, figure.missed_ratio) == (4, 3, 0.25)
    # Measured once: a later run leaves the figure alone.
    assert bulk_jobs_measure_slo(now=later + timedelta(seconds=60)) == 0

    # Once handled, a new measurement has every event, within the window.
    Delivery.objects.filter(pk=waiting.pk).update(next_attempt_at=timezone.now())
    deliveries_run_due()
    job = bulk_job_measure_slo(job=job, now=later)
    assert (job.slo_events, job.slo_within) == (4, 4)
    assert job.slo_p99_seconds is not None and 0 <= job.slo_p99_seconds < 120


def test_dead_deliveries_of_one_handler_are_rearmed_as_a_job(operator, push_handler):
    events = stored_events(6)
    rows = Delivery.objects.bulk_create(
        [
            Delivery(raw_event_id=e.id, handler="app.on_push", status="dead", attempts=5)
            for e in events[:4]
        ]
        + [Delivery(raw_event_id=e.id, handler="app.on_push", status="done") for e in events[4:]]
        + [Delivery(raw_event_id=events[0].id, handler="app.other", status="dead", attempts=5)]
    )
    job = bulk_job_preview(
        actor=operator,
        kind="rearm_deliveries",
        via="api",
        filters={"handler": "app.on_push", "source": "github"},
    )
    assert (job.total, job.breakdown["eligible"]) == (6, 4)
    assert dict(map(tuple, job.breakdown["by"]["status"])) == {"dead": 4, "done": 2}
    job = bulk_job_run(job_id=bulk_job_start(job=job, actor=operator, via="api").id, batch_size=4)
    assert (job.state, job.succeeded, job.refused) == ("done", 4, 2)
    assert "is not dead" in job.problems[0]["detail"]
    by_id = {row.pk: row for row in Delivery.objects.all()}
    assert [by_id[row.pk].status for row in rows] == [
        *["pending"] * 4,
        "done",
        "done",
        "dead",  # another handler's: not selected
    ]
    assert all(by_id[row.pk].attempts == 0 for row in rows[:4])
    assert OperatorAction.objects.get(bulk_job=job).action == "delivery_rearm"
    assert BulkJobItem.objects.filter(job=job).count() == 4


def test_a_delivery_reason_selects_by_error_class_never_by_the_handlers_message(
    operator, push_handler
):
    """A handler's message may quote the payload: the `reason` filter, open to operators
    without the payload permission, matches the class the error starts with, nothing else."""
    events = stored_events(3)
    Delivery.objects.bulk_create(
        [
            Delivery(
                raw_event_id=events[0].id,
                handler="app.on_push",
                status="dead",
                last_error="KeyError: 'card_number=4242'",
            ),
            Delivery(
                raw_event_id=events[1].id,
                handler="app.on_push",
                status="dead",
                last_error="ValueError: card_number=4242",
            ),
            Delivery(
                raw_event_id=events[2].id,
                handler="app.on_push",
                status="dead",
                last_error="card_number: free text",
            ),
        ]
    )

    def selected(reason: str) -> int:
        try:
            return bulk_job_preview(
                actor=operator, kind="rearm_deliveries", via="api", filters={"reason": reason}
            ).total
        except BulkJobError as refused:
            if str(refused) == NOTHING_SELECTED:
                return 0
            raise

    assert selected("KeyError") == 1
    assert selected("card_number") == 1  # the third error's class, by its shape: not its text
    assert selected("card") == 0
    for probe in ("KeyError: 'card", "card_number=4242", "4242", "%"):
        with pytest.raises(BulkJobError) as refused:
            selected(probe)
        assert refused.value.field == "reason"
