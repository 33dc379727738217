"""Benchmark: outbox dispatches per second against the local fake render service.

Not a test. It needs PostgreSQL on 127.0.0.1:5432 and uses its own database
(`eventdrop_bench_dispatch`), which it recreates. The fake render service
(fakes/renderer.py, callbacks off) runs as a separate process, so its request handling
does not share our interpreter. For each concurrency it stores a backlog of paid recaps (one
render row each, through the real payment service), runs ONE production dispatcher run
(`dispatch_run`, as `dispatch_side_effects --once` does) over it, and reports rows per second
from the run's start to its end — next to the fake's own rate for bare POST /renders at the
same concurrency, measured in the same run (plain `requests`, one fresh session per call, as
the dispatcher makes them), with and without a GET /health before each, and the ratio of
rows/s to bare POST/s (what a dispatch asks while the breaker is closed).

    .venv/bin/python bench/dispatch_throughput.py --rows 1000 --concurrency 1 4
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "eventdrop_bench_dispatch" + os.environ.get("EVENTDROP_BENCH_DB_SUFFIX", "")
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
MAX_ROWS = 20_000


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_fake(port: int) -> subprocess.Popen:
    # The test settings carry the render service's test secret.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "eventdrop.settings_test"}
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "run_fake_renderer", "--port", str(port), "--no-callbacks"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    import requests

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            requests.get(f"http://127.0.0.1:{port}/_stats", timeout=1)
            return proc
        except requests.RequestException:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("fake render service did not start")


def _setup_django(fake_url: str) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = DATABASE_URL
    os.environ["RENDER_SERVICE_URL"] = fake_url
    os.environ["RENDER_CALLBACK_URL"] = "http://127.0.0.1:9/webhooks/renderer/"
    # One log line per dispatch would be part of what we measure (and flood the terminal).
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventdrop.settings_test")
    import django

    django.setup()


def _recreate_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{DB_NAME}"')


def _store_backlog(count: int) -> None:
    from django.db import connection

    from bench.bulk_insert import bulk_insert
    from outbox.models import CircuitBreaker, RecapSideEffect, RecapSideEffectAttempt
    from recaps.models import Event, Photo, RecapVideo
    from recaps.services import recap_mark_paid
    from tests.recaps.factories import UserFactory

    tables = ", ".join(
        m._meta.db_table
        for m in (RecapSideEffectAttempt, RecapSideEffect, CircuitBreaker, RecapVideo)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables} CASCADE")
    buyer = UserFactory.create()
    event = Event.objects.first() or Event.objects.create(title="bench")
    if not Photo.objects.filter(event=event).exists():
        Photo.objects.bulk_create(
            Photo(event=event, storage_key=f"events/{event.pk}/photo-{n}.jpg") for n in range(6)
        )
    recaps = bulk_insert(RecapVideo, [RecapVideo(event=event, buyer=buyer) for _ in range(count)])
    for recap in recaps:
        recap_mark_paid(recap_id=recap.id, payment_reference=f"pi_{recap.id.hex[:16]}")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def _dispatch(concurrency: int, rows: int) -> dict:
    from django.db import connection

    from outbox.dispatcher import dispatch_run
    from outbox.models import RecapSideEffect

    _store_backlog(rows)
    connection.close()
    report = dispatch_run(budget_seconds=600, max_concurrency=concurrency)
    done = RecapSideEffect.objects.filter(status="done").count()
    assert done == rows, (done, rows, report.summary())
    return {"rows": rows, "seconds": report.elapsed_seconds, "rate": rows / report.elapsed_seconds}


def _fake_rate(url: str, concurrency: int, requests_total: int, *, health: bool) -> float:
    """Bare POST /renders (after GET /health if `health`) at `concurrency`, no database:
    the ceiling the fake allows. A dispatch asks for health only on the half-open probe."""
    import requests

    per_thread = max(requests_total // concurrency, 1)
    body = json.dumps({"recap_id": "bench", "photos": ["a"] * 6, "callback_url": ""}).encode()

    def work():
        for _ in range(per_thread):
            with requests.Session() as session:
                if health:
                    session.get(f"{url}/health", timeout=5)
                answer = session.post(
                    f"{url}/renders",
                    data=body,
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                    timeout=5,
                )
                assert answer.status_code == 202, answer.status_code

    threads = [threading.Thread(target=work) for _ in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return per_thread * concurrency / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    if not 1 <= args.rows <= MAX_ROWS:
        parser.error(f"--rows must be between 1 and {MAX_ROWS}")
    port = _free_port()
    fake = _start_fake(port)
    try:
        url = f"http://127.0.0.1:{port}"
        _recreate_database()
        _setup_django(url)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        print(
            f"{'slots':>5} {'rows':>6} {'seconds':>8} {'rows/s':>8} "
            f"{'fake health+POST/s':>18} {'fake POST/s':>11} {'ratio':>6}"
        )
        for concurrency in args.concurrency:
            result = _dispatch(concurrency, args.rows)
            with_health = _fake_rate(url, concurrency, args.rows, health=True)
            ceiling = _fake_rate(url, concurrency, args.rows, health=False)
            print(
                f"{concurrency:>5} {result['rows']:>6} {result['seconds']:>8.2f} "
                f"{result['rate']:>8.1f} {with_health:>18.1f} {ceiling:>11.1f} "
                f"{result['rate'] / ceiling:>6.2f}"
            )
    finally:
        fake.terminate()
        fake.wait(timeout=10)


if __name__ == "__main__":
    main()
