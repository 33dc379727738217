"""A bulk replay of 20,000 events as a job: cancelled from another connection mid-way,
re-run, started again, and run by a real `qcluster` process through django-q2's broker.

Slow (about 30-60 s on 2 shared cores): the rows are real, the batches real transactions.
"""

import threading
import time

import pytest
from django.conf import settings
from django.db import connection, connections
from django_q.conf import Conf

from console.jobs import services as bulk_jobs
from console.jobs.services import bulk_job_cancel, bulk_job_preview, bulk_job_run, bulk_job_start
from console.models import BulkJobItem, OperatorAction
from ingress.models import Delivery
from tests.console.test_bulk_jobs import stored_events
from tests.support.processes import app_env, start_manage

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

EVENTS = 20_000
BATCH = 500


def test_twenty_thousand_events_cancel_rerun_and_restart(operator, push_handler, monkeypatch):
    # The task is run here, by the test (the test settings' django-q2 would run it inline
    # at the start's commit, before the test could watch).
    monkeypatch.setattr(bulk_jobs, "_enqueue", lambda job_id: None)
    stored_events(EVENTS)
    job = bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={})
    assert job.total == EVENTS and job.breakdown["eligible"] == EVENTS
    job = bulk_job_start(job=job, actor=operator, via="api")

    # The operator clicks cancel from another connection while the 8th batch runs: the
    # cancel waits for that batch's commit (the job row is locked by it), no longer.
    real = bulk_jobs.raw_events_replay_batch
    batches: list[int] = []
    cancelled = threading.Event()
    waited: list[float] = []

    def cancel_from_elsewhere():
        started = time.monotonic()
        try:
            bulk_job_cancel(job=job, actor=operator)
        finally:
            waited.append(time.monotonic() - started)
            connections.close_all()
            cancelled.set()

    def replay(*, raw_event_ids, force=False):
        batches.append(len(raw_event_ids))
        if len(batches) == 8:
            threading.Thread(target=cancel_from_elsewhere).start()
            cancel_waiting_on_the_job_row()
        return real(raw_event_ids=raw_event_ids, force=force)

    def cancel_waiting_on_the_job_row():
        # Asked from inside the batch's transaction: a fresh statistics snapshot each time.
        deadline = time.monotonic() + 30
        with connection.cursor() as cursor:
            while True:
                cursor.execute(
                    "SELECT pg_stat_clear_snapshot(), count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                if cursor.fetchone()[1] or cancelled.is_set():
                    return
                assert time.monotonic() < deadline, "the cancel never waited on the job row"
                time.sleep(0.02)

    monkeypatch.setattr(bulk_jobs, "raw_events_replay_batch", replay)
    job = bulk_job_run(job_id=job.id, batch_size=BATCH)
    assert cancelled.wait(30)
    job = bulk_job_run(job_id=job.id, batch_size=BATCH)  # the cancel has landed by now

    assert job.state == "cancelled"
    assert job.processed == job.succeeded == len(batches) * BATCH
    assert 8 <= len(batches) <= 9  # the batch in flight when the cancel landed, at most
    assert waited[0] < 30  # it waited for a batch's commit, not for the job
    assert Delivery.objects.count() == job.processed
    action = OperatorAction.objects.get(bulk_job=job)
    assert (action.outcome, action.requested, action.succeeded, action.skipped) == (
        "cancelled",
        EVENTS,
        job.processed,
        EVENTS - job.processed,
    )

    # Re-run of the cancelled job (a duplicate task message, the sweep): nothing more.
    before = len(batches)
    assert bulk_job_run(job_id=job.id, batch_size=BATCH).processed == job.processed
    assert len(batches) == before

    # The operator starts the same selection again: every event, the first ones re-armed,
    # still one delivery per event and handler.
    again = bulk_job_start(
        job=bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={}),
        actor=operator,
        via="api",
    )
    again = bulk_job_run(job_id=again.id, batch_size=BATCH)
    assert (again.state, again.processed, again.succeeded, again.batches) == (
        "done",
        EVENTS,
        EVENTS,
        EVENTS // BATCH,
    )
    assert Delivery.objects.count() == EVENTS
    assert Delivery.objects.filter(status="pending", attempts=0).count() == EVENTS
    assert BulkJobItem.objects.filter(job=again).count() == EVENTS
    assert OperatorAction.objects.get(bulk_job=again).outcome == "succeeded"


def _test_database_url() -> str:
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def test_a_real_qcluster_runs_the_job_in_several_tasks(operator, monkeypatch, tmp_path):
    # No handler in the worker process for these: each replay arms nothing, which is
    # enough to watch the job's batches, continuations and final record go through.
    stored_events(2_000)
    env = app_env(
        _test_database_url(),
        Q_BROKER="orm",
        Q_WORKERS="1",
        BULK_JOB_BATCH_SIZE="200",
        # Each task gives up its worker after one batch and enqueues the next.
        BULK_JOB_TASK_BUDGET_SECONDS="0",
    )
    monkeypatch.setattr(Conf, "SYNC", False)  # enqueue for real, into the ORM broker
    cluster = start_manage(["qcluster"], env, log=tmp_path / "qcluster.log")
    try:
        job = bulk_job_start(
            job=bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={}),
            actor=operator,
            via="api",
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            job.refresh_from_db()
            if job.state not in ("queued", "running"):
                break
            assert cluster.alive, cluster.output()[-3000:]
            time.sleep(0.5)
    finally:
        cluster.stop()
    assert (job.state, job.processed, job.batches) == ("done", 2_000, 10), cluster.output()[-3000:]
    assert OperatorAction.objects.get(bulk_job=job).outcome == "succeeded"
    from django_q.models import Task

    runs = Task.objects.filter(group="console.bulk_job")
    assert runs.count() >= 5 and all(task.success for task in runs)
