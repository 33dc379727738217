"""Benchmark: how fast the inbox drains (verify + dedup + deliver), 1 and 2 workers.

Not a test. It needs PostgreSQL on 127.0.0.1:5432 and uses its own database
(`eventdrop_bench_inbox`), which it recreates. For each worker count it stores a backlog of
signed Stripe events (realistic ~1.5 KiB bodies, 2 % provider duplicates) with the real
receive service, starts that many worker *processes* running the real `inbox_run_once`
loop, and reports events/s from the first claim until every event is verified, deduplicated
and its handler delivery is done.

    .venv/bin/python bench/inbox_throughput.py --events 20000 --workers 1 2

Compare the figure with the ingress ACK rate (bench/ingress_ack.py): the pipeline must
drain at least as fast as the ingress accepts.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "eventdrop_bench_inbox"
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
EVENT_TYPE = "bench.inbox"
MAX_SECONDS_PER_RUN = 600


def _setup_django() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = DATABASE_URL
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventdrop.settings_test")
    import django

    django.setup()

    from ingress.handlers import webhook_handler

    # A handler that does what real handlers do: one small write in its transaction.
    @webhook_handler(provider="stripe", event_types=[EVENT_TYPE])
    def bench_handler(event, payload):
        from ingress.models import RawEvent

        RawEvent.objects.filter(pk=event.pk).update(query_string="handled")


def _recreate_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{DB_NAME}"')


def _store_backlog(count: int) -> int:
    import json

    from django.db import connection

    from ingress.models import DedupKey, Delivery, DeliveryAttempt, RawEvent
    from tests.support.signing import store_signed_stripe_event

    # TRUNCATE, not DELETE: a run must not inherit the previous run's dead tuples.
    tables = ", ".join(m._meta.db_table for m in (DeliveryAttempt, Delivery, DedupKey, RawEvent))
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables}")
    filler = "x" * 1200
    distinct = 0
    for n in range(count):
        # every 50th event is a provider redelivery of the previous one
        event_id = f"evt_bench_{n - 1 if n % 50 == 49 else n}"
        distinct += n % 50 != 49
        body = json.dumps(
            {"id": event_id, "object": "event", "type": EVENT_TYPE, "data": {"note": filler}}
        ).encode()
        store_signed_stripe_event(body)
    # What autovacuum would have done by the time a real backlog of this size is worked off.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return distinct


def _worker() -> None:
    _setup_django()
    from ingress.inbox import inbox_run_once

    deadline = time.monotonic() + MAX_SECONDS_PER_RUN
    idle_passes = 0
    while time.monotonic() < deadline and idle_passes < 3:
        idle_passes = idle_passes + 1 if inbox_run_once().idle else 0
        if idle_passes:
            time.sleep(0.2)


def _run(workers: int, events: int) -> dict:
    from django.db import connection

    from ingress.models import Delivery, RawEvent

    distinct = _store_backlog(events)
    connection.close()
    started = time.monotonic()
    procs = [
        subprocess.Popen([sys.executable, __file__, "--worker"], cwd=ROOT) for _ in range(workers)
    ]
    done_at = None
    while time.monotonic() - started < MAX_SECONDS_PER_RUN:
        settled = not RawEvent.objects.filter(signature_status="pending").exists()
        if settled and not Delivery.objects.exclude(status="done").exists():
            done_at = time.monotonic()
            break
        time.sleep(0.05)
    for proc in procs:
        proc.wait(timeout=30)
    elapsed = (done_at or time.monotonic()) - started
    delivered = Delivery.objects.filter(status="done").count()
    duplicates = RawEvent.objects.filter(dispatch_status="duplicate").count()
    assert done_at is not None, "backlog not drained within the time limit"
    assert delivered == distinct, (delivered, distinct)
    return {
        "workers": workers,
        "events": events,
        "deliveries": delivered,
        "duplicates": duplicates,
        "seconds": elapsed,
        "events_per_second": events / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker()
        return
    if args.events < 1 or args.events > 200_000:
        parser.error("--events must be between 1 and 200000")

    _recreate_database()
    _setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    results = [_run(workers, args.events) for workers in args.workers]
    print(f"inbox drain, {args.events} stored events (2 % duplicates), PostgreSQL")
    print(f"{'workers':>8} {'seconds':>9} {'events/s':>10} {'deliveries':>11} {'dups':>6}")
    for r in results:
        print(
            f"{r['workers']:>8} {r['seconds']:>9.1f} {r['events_per_second']:>10.0f} "
            f"{r['deliveries']:>11} {r['duplicates']:>6}"
        )
    if len(results) > 1:
        print(
            f"scaling {results[-1]['workers']} vs {results[0]['workers']} worker(s): "
            f"{results[-1]['events_per_second'] / results[0]['events_per_second']:.2f}x"
        )


if __name__ == "__main__":
    main()
