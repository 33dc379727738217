"""Benchmark: the ops page and a /metrics scrape on a store of 100k events, vs the admin index.

Not a test. It needs PostgreSQL on 127.0.0.1:5432 and uses its own database
(`eventdrop_bench_ops`), which it drops and recreates. It fills the store with bulk inserts:
100k raw events spread over the last 48 hours in daily partitions (four sources; realistic
shares of verified, rejected by reason, duplicate, unhandled and still-pending events, and
log-normal verification and processing lags), one delivery per dispatched event (mostly
done, some pending, processing and dead), 2,000 recaps with their render side effects, and
a month of nightly reconciliation runs.
Then it times N requests of each of three pages through the Django test client, round-robin
so that noise on a shared machine hits all three alike: the admin index (the baseline: a
staff page that reads no figures), /ops/ and /metrics (with the bearer token).

    .venv/bin/python bench/ops_page.py --events 100000 --requests 200
"""

import argparse
import json
import os
import random
import re
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "eventdrop_bench_ops" + os.environ.get("EVENTDROP_BENCH_DB_SUFFIX", "")
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
TOKEN = "bench-ops-metrics-token-0123456789abcdef"
SPREAD = timedelta(hours=48)
BATCH = 5000
SOURCES = {"stripe": 0.5, "github": 0.3, "slack": 0.15, "renderer": 0.05}
REASONS = {
    "bad_signature": 0.5,
    "stale_timestamp": 0.2,
    "malformed_header": 0.1,
    "missing_signature": 0.1,
    "unparseable_body": 0.1,
}


def _setup_django() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = DATABASE_URL
    os.environ["METRICS_BEARER_TOKEN"] = TOKEN
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventdrop.settings_test")
    import django

    django.setup()


def _recreate_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{DB_NAME}"')


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _body(rng: random.Random, n: int) -> bytes:
    # About the size of a Stripe checkout.session.completed event (~1.5 KiB).
    return json.dumps(
        {
            "id": f"evt_bench_{n}",
            "object": "event",
            "type": "checkout.session.completed",
            "data": {"object": {"id": f"cs_{n}", "metadata": {"recap_id": str(uuid.UUID(int=n))}}},
            "padding": "x" * rng.randint(1100, 1500),
        }
    ).encode()


def _fill(events: int, rng: random.Random) -> dict:
    from django.db import connection
    from django.utils import timezone

    from bench.bulk_insert import bulk_insert
    from ingress.models import Delivery, RawEvent
    from ingress.partitions import raw_event_partitions_maintain
    from ingress.sources import all_sources

    sources = all_sources()
    now = timezone.now()
    # Daily partitions for the whole spread first (maintenance creates from the day before
    # its `now`), so every row is inserted straight into its day.
    raw_event_partitions_maintain(now=now - SPREAD)
    counts: dict[str, int] = {}
    for start in range(0, events, BATCH):
        raw: list[RawEvent] = []
        plans: list[tuple[str, datetime, datetime | None] | None] = []
        for n in range(start, min(start + BATCH, events)):
            source = _pick(rng, SOURCES)
            received_at = now - SPREAD * (n / events)  # n = 0 is the newest
            age = (now - received_at).total_seconds()
            verify_lag = min(rng.lognormvariate(-0.7, 1.0), 120.0)
            status, reason, dispatch = "verified", "", "dispatched"
            roll = rng.random()
            if age < verify_lag:
                status, dispatch = "pending", "waiting"
            elif roll < 0.03:
                status, reason, dispatch = "rejected", _pick(rng, REASONS), "not_dispatched"
            elif roll < 0.05:
                dispatch = "duplicate"
            elif roll < 0.12:
                dispatch = "no_handler"
            verified_at = (
                None if status == "pending" else received_at + timedelta(seconds=verify_lag)
            )
            handle_lag = min(rng.lognormvariate(0.5, 1.2), 900.0)
            delivery = None
            if dispatch == "dispatched":
                delivery = "done"
                finish_age = age - verify_lag - handle_lag
                d_roll = rng.random()
                if finish_age < 0:
                    delivery = "pending" if d_roll < 0.7 else "processing"
                elif d_roll < 0.003:
                    delivery = "dead"
            handled_at = (
                verified_at + timedelta(seconds=handle_lag)
                if verified_at is not None and delivery in ("done", "dead")
                else None
            )
            counts[status] = counts.get(status, 0) + 1
            raw.append(
                RawEvent(
                    source=source,
                    provider=sources[source].provider,
                    method="POST",
                    path=f"/webhooks/{source}/",
                    headers={"content-type": "application/json"},
                    body=_body(rng, n),
                    body_sha256=f"{n:064x}",
                    remote_addr="127.0.0.1",
                    received_at=received_at,
                    delivery_id=f"bench-{n}",
                    signature_status=status,
                    rejection_reason=reason,
                    verified_at=verified_at,
                    verify_count=0 if status == "pending" else 1,
                    event_type="checkout.session.completed",
                    dedup_key="" if status != "verified" else f"evt_bench_{n}",
                    dispatch_status=dispatch,
                    handled_at=handled_at,
                )
            )
            # A delivery exists only for a dispatched, hence verified, event.
            plans.append(
                (delivery, verified_at, handled_at)
                if delivery is not None and verified_at is not None
                else None
            )
        stored = bulk_insert(RawEvent, raw)
        bulk_insert(
            Delivery,
            [
                Delivery(
                    raw_event_id=event.id,
                    handler="recaps.handlers.mark_recap_paid",
                    status=delivery,
                    attempts=8 if delivery == "dead" else 1,
                    total_attempts=8 if delivery == "dead" else 1,
                    next_attempt_at=verified_at,
                    claimed_at=verified_at if delivery == "processing" else None,
                    last_error="HandlerError: boom" if delivery == "dead" else "",
                    created_at=verified_at,
                    finished_at=handled_at,
                )
                for event, plan in zip(stored, plans, strict=True)
                if plan is not None
                for delivery, verified_at, handled_at in [plan]
            ],
        )
    _fill_outbox(rng, now)
    _fill_reconciliation(now)
    _fill_ack_rollup(rng, now)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return counts


def _fill_outbox(rng: random.Random, now) -> None:
    from django.contrib.auth import get_user_model

    from bench.bulk_insert import bulk_insert
    from outbox.models import RecapSideEffect
    from recaps.models import Event, RecapVideo

    event = Event.objects.create(title="Bench party")
    buyer = get_user_model().objects.create_user("bench-buyer")
    recaps, effects = [], []
    for n in range(2000):
        status = "done" if n >= 20 else ("pending" if n >= 3 else "dead")
        recap = RecapVideo(
            event=event,
            buyer=buyer,
            status={"done": "ready", "pending": "paid", "dead": "failed"}[status],
            payment_reference=f"pi_bench_{n}",
            paid_at=now - timedelta(minutes=n),
            video_url="https://videos.example/bench.mp4" if status == "done" else "",
            ready_at=now if status == "done" else None,
            failed_at=now if status == "dead" else None,
            failure_reason="render request gave up after 5 attempt(s)" if status == "dead" else "",
        )
        recaps.append(recap)
        effects.append(
            RecapSideEffect(
                recap=recap,
                effect_type="render",
                status=status,
                attempts=5 if status == "dead" else 1,
                next_attempt_at=now - timedelta(seconds=rng.randint(0, 90)),
                last_error="The render service answered HTTP 500." if status == "dead" else "",
                last_error_class="http_500" if status == "dead" else "",
                finished_at=now if status in ("done", "dead") else None,
            )
        )
    bulk_insert(RecapVideo, recaps)
    bulk_insert(RecapSideEffect, effects)


def _fill_reconciliation(now) -> None:
    """A month of nightly runs for Stripe and one GitHub hook, mostly without drift."""
    from ingress.models import ReconciliationRun

    runs = []
    for day in range(30):
        for provider, scope, listed in (("stripe", "", 12_500), ("github", "repo acme/app", 7_500)):
            finished_at = now - timedelta(days=day, hours=3)
            missing = 1 if day % 10 == 4 else 0
            runs.append(
                ReconciliationRun(
                    provider=provider,
                    source=provider,
                    scope=scope,
                    window_start=finished_at - timedelta(days=2),
                    window_end=finished_at - timedelta(minutes=5),
                    started_at=finished_at - timedelta(minutes=2),
                    finished_at=finished_at,
                    status="complete",
                    pages=listed // 100,
                    provider_count=listed,
                    known_count=listed - missing,
                    missing_count=missing,
                    backfilled_count=missing if provider == "stripe" else 0,
                    redelivered_count=missing if provider == "github" else 0,
                    drift=missing / listed,
                )
            )
    ReconciliationRun.objects.bulk_create(runs)


def _fill_ack_rollup(rng: random.Random, now) -> None:
    """48 h of the web processes' ACK roll-up: one row per source and hour, as they keep."""
    from console.models import ACK_ROLLUP_BUCKETS, AckLatencyHour

    hour = now.replace(minute=0, second=0, microsecond=0)
    rows = []
    for hours_ago in range(48):
        for source in SOURCES:
            counts = {column: 0 for _, column in ACK_ROLLUP_BUCKETS}
            for _ in range(200):
                seconds = rng.lognormvariate(-5, 0.8)  # ~7 ms median
                column = next(c for bound, c in ACK_ROLLUP_BUCKETS if seconds <= bound)
                counts[column] += 1
            rows.append(
                AckLatencyHour(source=source, hour=hour - timedelta(hours=hours_ago), **counts)
            )
    AckLatencyHour.objects.bulk_create(rows)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _time_pages(requests: int) -> dict:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    admin = get_user_model().objects.create_superuser("bench-admin")
    staff = Client()
    staff.force_login(admin)
    scraper = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    pages = {
        "admin index (baseline)": (staff, "/admin/"),
        "/ops/": (staff, "/ops/"),
        "/metrics": (scraper, "/metrics"),
    }
    timings: dict[str, list[float]] = {name: [] for name in pages}
    queries: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for name, (client, url) in pages.items():  # warm-up, and one counted run each
        for _ in range(3):
            assert client.get(url).status_code == 200, url
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        queries[name], sizes[name] = len(captured), len(response.content)
    for _ in range(requests):
        for name, (client, url) in pages.items():
            started = time.perf_counter()
            response = client.get(url)
            timings[name].append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
    return {"timings": timings, "queries": queries, "sizes": sizes}


def _volume_query_partitions(read=None) -> tuple[int, int]:
    """(partitions a 24 h query reads, partitions attached): pruning at work."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from console.ops.figures import raw_event_volume

    with CaptureQueriesContext(connection) as captured:
        (read or raw_event_volume)(now=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + captured[0]["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'ingress_rawevent'::regclass"
        )
        attached = cursor.fetchone()[0]
    scanned = set(re.findall(r"\bon (ingress_rawevent_\w+)", plan))
    return len(scanned), attached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if not 1_000 <= args.events <= 1_000_000:
        parser.error("--events must be between 1000 and 1000000")

    _recreate_database()
    _setup_django()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    fill_started = time.monotonic()
    counts = _fill(args.events, random.Random(args.seed))
    fill_seconds = time.monotonic() - fill_started
    result = _time_pages(args.requests)
    scanned, attached = _volume_query_partitions()

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg_version = cursor.fetchone()[0]
    print(
        f"ops page and /metrics: {args.events} raw events over 48 h "
        f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}), "
        f"PostgreSQL {pg_version}, filled in {fill_seconds:.0f} s, "
        f"{args.requests} requests each, round-robin; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"24 h volume query reads {scanned} of {attached} raw event partitions")
    from console.ops.figures import hourly_lags, hourly_volume

    for read in (hourly_volume, hourly_lags):
        scanned, attached = _volume_query_partitions(read)
        print(f"chart query {read.__name__} reads {scanned} of {attached} raw event partitions")
    from django.utils import timezone

    from console.ops.figures import hourly_ack_p99

    for read in (hourly_volume, hourly_lags, hourly_ack_p99):
        took = []
        for _ in range(5):
            started = time.perf_counter()
            read(now=timezone.now())
            took.append((time.perf_counter() - started) * 1000)
        print(f"chart read {read.__name__}: {statistics.median(took):.1f} ms (median of 5)")
    baseline = statistics.median(result["timings"]["admin index (baseline)"])
    print(
        f"{'page':<24} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'p50 x base':>11} {'queries':>8}"
    )
    for name, values in result["timings"].items():
        p50 = statistics.median(values)
        print(
            f"{name:<24} {p50:>8.1f} {_percentile(values, 0.95):>8.1f} {max(values):>8.1f} "
            f"{p50 / baseline:>11.2f} {result['queries'][name]:>8}"
        )


if __name__ == "__main__":
    main()
