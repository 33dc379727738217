"""A real `qcluster` worker SIGKILLed in the middle of a bulk job's batch: the batch's work
is lost with its connection, the minute sweep enqueues the job again, and a new worker
resumes at the committed cursor — every row acted on once, the counts exact.

The batch is caught mid-way by holding a row lock on one of its raw events from the test
(the replay locks its events in id order), so the kill lands inside its transaction.
"""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone
from django_q.conf import Conf

from console.jobs.services import bulk_job_preview, bulk_job_start, bulk_jobs_resume_stale
from console.models import BulkJob, BulkJobItem, OperatorAction
from ingress.models import RawEvent
from tests.console.test_bulk_jobs import stored_events
from tests.console.test_bulk_jobs_large import _test_database_url
from tests.support.processes import app_env, start_manage

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.django_db(transaction=True)]

EVENTS = 600
BATCH = 200


def _wait(predicate, *, seconds: float, what: str, cluster=None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        if cluster is not None:
            assert cluster.alive, cluster.output()[-3000:]
        time.sleep(0.2)
    raise AssertionError(
        f"timed out waiting for {what}" + (cluster.output()[-3000:] if cluster else "")
    )


def _backends_waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def _hold_row_lock(event_id: int, locked: threading.Event, release: threading.Event) -> None:
    try:
        with transaction.atomic():
            list(RawEvent.objects.select_for_update().filter(id=event_id).values_list("id"))
            locked.set()
            release.wait(90)
    finally:
        connections.close_all()


def test_a_worker_killed_mid_batch_is_resumed_at_its_cursor_and_nothing_is_done_twice(
    operator, monkeypatch, tmp_path
):
    events = stored_events(EVENTS)
    env = app_env(
        _test_database_url(), Q_BROKER="orm", Q_WORKERS="1", BULK_JOB_BATCH_SIZE=str(BATCH)
    )
    monkeypatch.setattr(Conf, "SYNC", False)  # enqueue for real, into the ORM broker

    # An event of the second batch is locked: the worker's second batch waits on it.
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(
        target=_hold_row_lock, args=(events[BATCH + BATCH // 2].id, locked, release)
    )
    holder.start()
    assert locked.wait(10)

    cluster = start_manage(["qcluster"], env, log=tmp_path / "qcluster-1.log")
    try:
        job = bulk_job_start(
            job=bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={}),
            actor=operator,
            via="api",
        )

        def first_batch_committed_and_second_waiting() -> bool:
            job.refresh_from_db()
            return job.batches == 1 and _backends_waiting_on_a_lock() > 0

        _wait(first_batch_committed_and_second_waiting, seconds=60, what="batch 2", cluster=cluster)
        cluster.kill()
        _wait(lambda: not cluster.alive, seconds=10, what="the kill")
    finally:
        release.set()
        holder.join(30)
        cluster.stop()
    # The killed worker's backend finds its client gone once the lock is granted: rolled back.
    _wait(lambda: _backends_waiting_on_a_lock() == 0, seconds=30, what="the orphan backend")
    job.refresh_from_db()
    assert (job.state, job.batches, job.processed) == ("running", 1, BATCH)
    assert job.cursor == events[BATCH - 1].id
    assert BulkJobItem.objects.filter(job=job).count() == BATCH

    # The minute sweep, once the heartbeat is stale, enqueues the job; a new worker runs it.
    resumed = start_manage(["qcluster"], env, log=tmp_path / "qcluster-2.log")
    try:
        later = timezone.now() + timedelta(hours=1)
        assert bulk_jobs_resume_stale(now=later) == [job.id]

        def finished() -> bool:
            job.refresh_from_db()
            return job.state not in ("queued", "running")

        _wait(finished, seconds=60, what="the resumed job", cluster=resumed)
    finally:
        resumed.stop()

    assert (job.state, job.batches, job.processed, job.succeeded, job.failed) == (
        "done",
        EVENTS // BATCH,
        EVENTS,
        EVENTS,
        0,
    ), resumed.output()[-3000:]
    items = list(BulkJobItem.objects.filter(job=job).values_list("target_id", flat=True))
    assert sorted(items) == [e.id for e in events]  # each row once
    action = OperatorAction.objects.get(bulk_job=job)
    assert (action.outcome, action.requested, action.succeeded, action.skipped) == (
        "succeeded",
        EVENTS,
        EVENTS,
        0,
    )
    assert BulkJob.objects.count() == 1
