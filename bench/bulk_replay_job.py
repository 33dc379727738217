"""A bulk replay job of --events handled events, with real inbox workers, measured (issue 13).

    .venv/bin/python bench/bulk_replay_job.py --events 100000 --workers 2

A fresh database on 127.0.0.1:5432 (eventdrop_bench_bulkjob), --events verified Stripe
events each with one done delivery to the bench handler (bench/handlers.py), then
--workers real `manage.py process_inbox` processes. In this process: the preview (what the
web request does), the start, and the job's task function run to the end (what a django-q2
worker does), while a probe thread stores a webhook every 100 ms through the receive path's
own service (raw_event_store) and times it. Afterwards, once the workers have handled every
replayed delivery (or 15 min passed), the replay SLO is measured as the sweep would.

Prints one JSON object: preview seconds, job seconds and rows/s, each batch's transaction
(the longest any row lock of the job is held), the probe's store latency during the job, and
the SLO (events handled within 2 min of the click, p99 click -> handled).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DB_NAME = "eventdrop_bench_bulkjob" + os.environ.get("EVENTDROP_BENCH_DB_SUFFIX", "")
SETTINGS = "bench.settings_inbox"
HANDLER = "bench.handlers.count_bench_delivery_0"


def _env(port: int) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/{DB_NAME}",
        "EVENTDROP_BENCH_HANDLERS": "1",
        "INBOX_IDLE_SLEEP_SECONDS": "0.05",
    }
    env.pop("PYTHONPATH", None)
    return env


def _manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=600,
        stdout=subprocess.DEVNULL,  # its errors stay on stderr
    )


def _load(count: int) -> None:
    import hashlib

    from django.utils import timezone

    from bench.bulk_insert import bulk_insert
    from ingress.models import Delivery, RawEvent

    now = timezone.now()
    chunk = 5000
    for start in range(0, count, chunk):
        rows = []
        for n in range(start, min(start + chunk, count)):
            body = json.dumps(
                {"id": f"evt_bulk_{n}", "type": "payment_intent.succeeded", "created": 0}
            ).encode()
            rows.append(
                RawEvent(
                    source="stripe",
                    provider="stripe",
                    method="POST",
                    path="/webhooks/stripe/",
                    headers={"content-type": "application/json"},
                    body=body,
                    body_sha256=hashlib.sha256(body).hexdigest(),
                    received_at=now - timedelta(seconds=(count - n) / 1000),
                    signature_status="verified",
                    verified_at=now,
                    event_type="payment_intent.succeeded",
                    dedup_key=f"id:evt_bulk_{n}",
                    dispatch_status="dispatched",
                    handled_at=now,
                )
            )
        events = bulk_insert(RawEvent, rows)
        bulk_insert(
            Delivery,
            [
                Delivery(raw_event_id=e.id, handler=HANDLER, status="done", finished_at=now)
                for e in events
            ],
        )


def _probe(stop: threading.Event, latencies: list[float]) -> None:
    from django.db import connection

    from ingress.services import raw_event_store
    from ingress.sources import all_sources

    source = all_sources()["github"]
    n = 0
    while not stop.is_set():
        started = time.monotonic()
        raw_event_store(
            source=source,
            method="POST",
            path="/webhooks/github/",
            query_string="",
            headers={"x-github-delivery": f"probe-{n}"},
            body=b"{}",
            remote_addr=None,
        )
        latencies.append(time.monotonic() - started)
        n += 1
        stop.wait(0.1)
    connection.close()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pg-port", type=int, default=5432)
    args = parser.parse_args()

    import psycopg

    admin = f"postgresql://postgres@127.0.0.1:{args.pg_port}/postgres"
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{DB_NAME}"')
    env = _env(args.pg_port)
    _manage("migrate", "--noinput", env=env)
    _manage("raw_event_partitions", env=env)
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from console.jobs import services as bulk_jobs
    from ingress.models import Delivery

    loaded = time.monotonic()
    _load(args.events)
    load_seconds = time.monotonic() - loaded
    operator = get_user_model().objects.create_superuser("bench", password=None)

    workers = [
        subprocess.Popen(
            [sys.executable, "manage.py", "process_inbox"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(args.workers)
    ]
    batch_seconds: list[float] = []
    real_batch = bulk_jobs._run_batch

    def timed_batch(job_id: int, batch_size: int) -> bool:
        started = time.monotonic()
        try:
            return real_batch(job_id, batch_size)
        finally:
            batch_seconds.append(time.monotonic() - started)

    def run_here(job_id: int) -> None:
        """The task is this process's bulk_job_run call below, not a django-q2 worker's."""

    bulk_jobs._run_batch = timed_batch
    bulk_jobs._enqueue = run_here
    stop = threading.Event()
    probe: list[float] = []
    prober = threading.Thread(target=_probe, args=(stop, probe))
    try:
        started = time.monotonic()
        job = bulk_jobs.bulk_job_preview(
            actor=operator, kind="replay_raw_events", via="api", filters={"source": "stripe"}
        )
        preview_seconds = time.monotonic() - started
        prober.start()
        job = bulk_jobs.bulk_job_start(job=job, actor=operator, via="api")
        started = time.monotonic()
        job = bulk_jobs.bulk_job_run(job_id=job.id, budget_seconds=3600)
        job_seconds = time.monotonic() - started
        stop.set()
        prober.join()
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if not Delivery.objects.exclude(status="done").filter(handler=HANDLER).exists():
                break
            time.sleep(1)
        drained_seconds = time.monotonic() - started
    finally:
        stop.set()
        for proc in workers:
            proc.terminate()
        for proc in workers:
            proc.wait(timeout=30)
    job = bulk_jobs.bulk_job_measure_slo(job=job)
    result = {
        "events": args.events,
        "workers": args.workers,
        "load_seconds": round(load_seconds, 1),
        "preview_seconds": round(preview_seconds, 3),
        "job": {"state": job.state, "processed": job.processed, "batches": job.batches},
        "job_seconds": round(job_seconds, 1),
        "job_rows_per_second": round(job.processed / job_seconds, 1),
        "batch_seconds_median": round(statistics.median(batch_seconds), 3),
        "batch_seconds_max": round(max(batch_seconds), 3),
        "store_during_job_p99_ms": round(_quantile(probe, 0.99) * 1000, 1),
        "store_during_job_max_ms": round(max(probe, default=0) * 1000, 1),
        "store_samples": len(probe),
        "drained_seconds": round(drained_seconds, 1),
        "slo_events": job.slo_events,
        "slo_within_2_min": job.slo_within,
        "slo_p99_seconds": job.slo_p99_seconds,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
