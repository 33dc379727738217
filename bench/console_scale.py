"""Benchmark: every console page at the seed's volume, built in SQL.

Not a test. It needs PostgreSQL on 127.0.0.1:5432 and uses its own database
(`eventdrop_bench_console`), which it recreates unless `--reuse` finds it built at the same
size (then it only migrates, which also measures what the migrations cost on a big store).
The store is made with `INSERT … SELECT FROM generate_series`, spread over `--days` daily
partitions (90: the retention), about 1/days of it in the last 24 hours: raw events of four
sources (verified, 3 % rejected by reason, duplicates, unhandled ones, a pending minute),
one delivery per dispatched event (done; one in 10,000 dead, the last minutes pending), one
recap with its render side effect per 100 events, operator actions and a month of
reconciliation runs. Then it times `--requests` GETs of every page through Django's test
client, as a superuser and as staff without the payload permission: each admin list plain,
filtered by every filter it offers, searched, deep; the detail pages; /ops/, the incidents,
/metrics, /api/queues/; every API list and detail.

    .venv/bin/python bench/console_scale.py --events 1000000 --requests 7
    .venv/bin/python bench/console_scale.py --events 20000000 --requests 7 --reuse --drop
"""

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "eventdrop_bench_console" + os.environ.get("EVENTDROP_BENCH_DB_SUFFIX", "")
DATABASE_URL = f"postgres://postgres@127.0.0.1:5432/{DB_NAME}"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TOKEN = "bench-console-metrics-token-0123456789"
CHUNK = 500_000
HANDLERS = {
    "stripe": "recaps.handlers.record_checkout_session",
    "renderer": "outbox.handlers.record_render_result",
    "github": "bench.github_push",
    "slack": "bench.slack_message",
}
EVENT_TYPES = {
    "stripe": "checkout.session.completed",
    "github": "push",
    "slack": "event_callback",
    "renderer": "render.completed",
}
REASONS = ("bad_signature", "stale_timestamp", "malformed_header", "missing_signature")
VIEW_PERMISSIONS = (
    "ingress.view_rawevent",
    "ingress.view_delivery",
    "outbox.view_recapsideeffect",
    "recaps.view_recapvideo",
    "console.view_operatoraction",
    "console.view_ops",
)


def _setup_django() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = DATABASE_URL
    os.environ["METRICS_BEARER_TOKEN"] = TOKEN
    # A page of the console may take its time on the store it is measured on.
    os.environ.setdefault("DATABASE_STATEMENT_TIMEOUT_MS", "600000")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventdrop.settings_test")
    import django

    django.setup()
    from bench import register_console_bench_handlers
    from kernel.db.plans import serve_pages

    serve_pages()  # as the web process serving the console does
    register_console_bench_handlers()


def _built_size() -> int | None:
    """The size the bench database was built at, None when there is none."""
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as db:
        if not db.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB_NAME]).fetchone():
            return None
    with psycopg.connect(DATABASE_URL.replace("postgres://", "postgresql://")) as db:
        row = db.execute(
            "SELECT obj_description('ingress_rawevent'::regclass, 'pg_class')"
        ).fetchone()
    return int(row[0]) if row and row[0] and row[0].isdigit() else None


def _recreate_database() -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{DB_NAME}"')


def drop_database() -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


def _partitions(cursor, now, days: int) -> None:
    """One partition per day of the spread (maintenance creates only from yesterday on)."""
    from ingress.partitions import partition_name

    today = now.date()
    for back in range(days + 1):
        day = today - timedelta(days=back)
        cursor.execute(
            f'CREATE TABLE IF NOT EXISTS "{partition_name(day)}" PARTITION OF ingress_rawevent '
            f"FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')"
        )


def _case(column_sql: str, mapping: dict[str, str]) -> str:
    whens = " ".join(f"WHEN '{key}' THEN '{value}'" for key, value in mapping.items())
    return f"CASE {column_sql} {whens} END"


# One chunk of raw events, with a delivery for every dispatched one, in one statement. All
# values derive from g (deterministic): ids and received_at grow together, as in production.
RAW_EVENTS_SQL = """
WITH spec AS (
    SELECT g,
           %(start)s::timestamptz
               + (%(span)s::interval * ((g - 1)::float8 / %(total)s::float8)) AS at,
           (g * 7919) %% 1000 AS roll,
           CASE WHEN (g * 31) %% 100 < 50 THEN 'stripe' WHEN (g * 31) %% 100 < 80 THEN 'github'
                WHEN (g * 31) %% 100 < 95 THEN 'slack' ELSE 'renderer' END AS source
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
), shaped AS (
    SELECT *,
           CASE WHEN at > %(now)s::timestamptz - interval '30 seconds' THEN 'pending'
                WHEN roll < 30 THEN 'rejected' ELSE 'verified' END AS status
    FROM spec
), rows AS (
    SELECT *,
           CASE status WHEN 'pending' THEN 'waiting' WHEN 'rejected' THEN 'not_dispatched'
                ELSE CASE WHEN roll < 50 THEN 'duplicate' WHEN roll < 120 THEN 'no_handler'
                          ELSE 'dispatched' END END AS dispatch,
           CASE WHEN status = 'pending' THEN NULL
                ELSE at + make_interval(secs => 1 + g %% 7) END AS verdict_at
    FROM shaped
), inserted AS (
    INSERT INTO ingress_rawevent (
        source, provider, method, path, query_string, headers, body, body_encryption,
        body_sha256, remote_addr, received_at, delivery_id, signature_status, rejection_reason,
        matched_secret_index, verified_at, verify_count, event_type, provider_retry_reason,
        dedup_key, dispatch_status, handled_at, processing_failures, processing_error, origin,
        payload_dropped_bytes, region
    )
    SELECT source, {provider}, 'POST', '/webhooks/' || source || '/', '',
           '{{"content-type": "application/json"}}'::jsonb,
           convert_to('{{"id": "evt_bench_' || g || '", "type": "' || {event_type}
                      || '", "data": {{"object": {{"id": "cs_bench_' || g
                      || '", "amount": ' || (g %% 9000) || '}}}}, "padding": "'
                      || repeat('x', (200 + g %% 200)::int) || '"}}', 'UTF8'),
           '', md5(g::text) || md5('bench' || g), '127.0.0.1', at, 'bench-' || g, status,
           CASE WHEN status = 'rejected' THEN (ARRAY{reasons})[1 + g %% {reason_count}]
                ELSE '' END,
           CASE WHEN status = 'verified' THEN 0 END, verdict_at,
           CASE WHEN status = 'pending' THEN 0 ELSE 1 END, {event_type}, '',
           CASE WHEN status = 'verified' THEN 'evt_bench_' || g ELSE '' END, dispatch,
           CASE WHEN dispatch = 'dispatched' AND at < %(now)s::timestamptz - interval '5 minutes'
                THEN verdict_at + interval '2 seconds' END,
           0, '', CASE WHEN g %% 100003 = 0 THEN 'backfilled' ELSE 'received' END, 0, ''
    FROM rows
    RETURNING id, source, received_at, verified_at, handled_at, dispatch_status
)
INSERT INTO ingress_delivery (
    raw_event_id, handler, status, attempts, total_attempts, next_attempt_at, claimed_at,
    last_error, created_at, finished_at, ordering_key, forced, worker_deaths
)
SELECT id, {handler},
       CASE WHEN handled_at IS NULL THEN 'pending' WHEN id %% 10007 = 0 THEN 'dead'
            ELSE 'done' END,
       CASE WHEN id %% 10007 = 0 THEN 8 ELSE 1 END, CASE WHEN id %% 10007 = 0 THEN 8 ELSE 1 END,
       verified_at, NULL,
       CASE WHEN handled_at IS NOT NULL AND id %% 10007 = 0
            THEN CASE WHEN id %% 2 = 0 THEN 'KeyError: ''recap_id''' ELSE 'TimeoutError: upstream'
                 END ELSE '' END,
       verified_at, handled_at, '', false, 0
FROM inserted WHERE dispatch_status = 'dispatched'
"""


def _fill(events: int, days: int) -> dict:
    from django.db import connection
    from django.utils import timezone

    from ingress.sources import all_sources

    sources = all_sources()
    now = timezone.now()
    span = timedelta(days=days)
    provider = _case("source", {name: sources[name].provider for name in HANDLERS})
    sql = RAW_EVENTS_SQL.format(
        provider=provider,
        event_type=_case("source", EVENT_TYPES),
        handler=_case("source", HANDLERS),
        reasons="[" + ", ".join(f"'{reason}'" for reason in REASONS) + "]",
        reason_count=len(REASONS),
    )
    started = time.monotonic()
    with connection.cursor() as cursor:
        _partitions(cursor, now, days)
        for first in range(1, events + 1, CHUNK):
            last = min(first + CHUNK - 1, events)
            params: dict[str, Any] = {
                "start": now - span,
                "span": span,
                "total": events,
                "first": first,
                "last": last,
                "now": now,
            }
            cursor.execute(sql, params)
            rate = last / (time.monotonic() - started)
            print(f"  {last:,} raw events ({rate:,.0f}/s)", file=sys.stderr, flush=True)
    _fill_recaps(events // 100, now)
    _fill_audit(now)
    _fill_reconciliation(now)
    _fill_ack_rollup(now)
    with connection.cursor() as cursor:
        cursor.execute(f"COMMENT ON TABLE ingress_rawevent IS '{events}'")
        cursor.execute("VACUUM (ANALYZE)")
    return {"fill_seconds": time.monotonic() - started, "now": now}


def _fill_recaps(count: int, now) -> None:
    """One recap per 100 events, each with its render side effect: mostly ready."""
    from django.db import connection

    from recaps.models import Event

    event = Event.objects.create(title="Bench party")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, "
            "email, is_staff, is_active, date_joined) VALUES ('!', false, 'bench-buyer', '', '', "
            "'', false, true, now()) RETURNING id"
        )
        buyer = cursor.fetchone()[0]
        cursor.execute(
            """
            WITH made AS (
                INSERT INTO recap_videos (
                    id, event_id, buyer_id, status, is_free, payment_reference,
                    checkout_session_id, awaiting_payment_reason, render_id, video_url,
                    failure_reason, created_at, updated_at, paid_at, ready_at, failed_at)
                SELECT md5('recap' || g)::uuid, %(event)s, %(buyer)s,
                       status, false, 'pi_bench_' || g, 'cs_bench_' || g,
                       '', 'render_bench_' || g,
                       CASE status WHEN 'ready' THEN 'https://videos.example/' || g ELSE '' END,
                       CASE status WHEN 'failed' THEN 'render gave up after 5 attempts'
                            ELSE '' END,
                       at, at, at, CASE status WHEN 'ready' THEN at END,
                       CASE status WHEN 'failed' THEN at END
                FROM (SELECT g, %(now)s::timestamptz - make_interval(mins => g::int) AS at,
                             CASE WHEN g %% 500 = 0 THEN 'failed' WHEN g %% 97 = 0 THEN 'paid'
                                  ELSE 'ready' END AS status
                      FROM generate_series(1, %(count)s::int) AS g) AS planned
                RETURNING id, status, created_at
            )
            INSERT INTO recap_side_effects (
                recap_id, effect_type, status, attempts, next_attempt_at, key_generation,
                last_error, last_error_class, wait_reason, created_at, updated_at, finished_at)
            SELECT id, 'render',
                   CASE status WHEN 'failed' THEN 'dead' WHEN 'paid' THEN 'pending'
                        ELSE 'done' END,
                   CASE status WHEN 'failed' THEN 5 ELSE 1 END, created_at, 0,
                   CASE status WHEN 'failed' THEN 'The render service answered HTTP 500.'
                        ELSE '' END,
                   CASE status WHEN 'failed' THEN 'http_500' ELSE '' END, '', created_at,
                   created_at, CASE WHEN status = 'paid' THEN NULL ELSE created_at END
            FROM made
            """,
            {"event": event.id, "buyer": buyer, "now": now, "count": max(count, 10)},
        )


def _fill_audit(now) -> None:
    from console.models import OperatorAction

    OperatorAction.objects.bulk_create(
        OperatorAction(
            actor_username="bench-oncall",
            action="raw_event_replay",
            via="admin",
            target_model="ingress.rawevent",
            target_ids=[n],
            requested=1,
            succeeded=1,
            outcome="succeeded",
            results=[{"id": n, "outcome": "ok", "detail": "1 deliveries queued"}],
            started_at=now - timedelta(minutes=n),
            finished_at=now - timedelta(minutes=n),
        )
        for n in range(1, 5001)
    )


def _fill_reconciliation(now) -> None:
    from ingress.models import ReconciliationRun

    ReconciliationRun.objects.bulk_create(
        ReconciliationRun(
            provider=provider,
            source=provider,
            scope=scope,
            window_start=now - timedelta(days=day + 2),
            window_end=now - timedelta(days=day, minutes=5),
            started_at=now - timedelta(days=day, minutes=3),
            finished_at=now - timedelta(days=day),
            status="complete",
            provider_count=10_000,
            known_count=10_000,
            drift=0.0,
        )
        for day in range(30)
        for provider, scope in (("stripe", ""), ("github", "repo acme/app"))
    )


def _fill_ack_rollup(now) -> None:
    from console.models import ACK_ROLLUP_BUCKETS, AckLatencyHour

    hour = now.replace(minute=0, second=0, microsecond=0)
    AckLatencyHour.objects.bulk_create(
        AckLatencyHour(
            source=source,
            hour=hour - timedelta(hours=back),
            **{column: 100 for _, column in ACK_ROLLUP_BUCKETS[2:6]},
        )
        for back in range(48)
        for source in HANDLERS
    )


# --- the pages ---------------------------------------------------------------------------------


def _samples() -> dict:
    """Ids and keys of rows in the last day, to open and to search for."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, delivery_id, dedup_key, received_at FROM ingress_rawevent "
            "WHERE received_at > now() - interval '1 day' AND dispatch_status = 'dispatched' "
            "AND dedup_key <> '' ORDER BY received_at DESC LIMIT 1 OFFSET 10"
        )
        raw_id, delivery_id, dedup_key, received_at = cursor.fetchone()
        cursor.execute(
            "SELECT id FROM ingress_delivery WHERE raw_event_id = %s ORDER BY id LIMIT 1", [raw_id]
        )
        delivery = cursor.fetchone()[0]
        cursor.execute("SELECT id, recap_id FROM recap_side_effects ORDER BY id DESC LIMIT 1")
        side_effect, recap = cursor.fetchone()
    return {
        "raw_id": raw_id,
        "delivery_id": delivery_id,
        "dedup_key": dedup_key,
        "received_at": received_at,
        "delivery": delivery,
        "side_effect": side_effect,
        "recap": recap,
    }


def pages(sample: dict) -> dict[str, str]:
    """Every page the console serves from the store, by a name for the table."""
    raw = "/admin/ingress/rawevent/"
    deliveries = "/admin/ingress/delivery/"
    side_effects = "/admin/outbox/recapsideeffect/"
    day_ago = (sample["received_at"] - timedelta(days=1)).isoformat(sep=" ", timespec="seconds")
    q = lambda **params: "?" + urlencode(params)  # noqa: E731
    return {
        "admin raw events": raw,
        "admin raw events, page 50": raw + q(p=49),
        "admin raw events, status rejected": raw + q(signature_status__exact="rejected"),
        "admin raw events, status pending": raw + q(signature_status__exact="pending"),
        "admin raw events, reason bad_signature": raw + q(rejection_reason__exact="bad_signature"),
        "admin raw events, reason unknown_source": raw
        + q(rejection_reason__exact="unknown_source"),
        "admin raw events, dispatch no_handler": raw + q(dispatch_status__exact="no_handler"),
        "admin raw events, dispatch duplicate": raw + q(dispatch_status__exact="duplicate"),
        "admin raw events, origin backfilled": raw + q(origin__exact="backfilled"),
        "admin raw events, origin restored": raw + q(origin__exact="restored"),
        "admin raw events, source renderer": raw + q(source="renderer"),
        "admin raw events, provider slack": raw + q(provider="slack"),
        "admin raw events, received since a day": raw + q(received_at__gte=day_ago),
        "admin raw events, event type push": raw + q(event_type="push"),
        "admin raw events, search id": raw + q(q=str(sample["raw_id"])),
        "admin raw events, search delivery id": raw + q(q=sample["delivery_id"]),
        "admin raw events, search dedup key": raw + q(q=sample["dedup_key"]),
        "admin raw events, search nothing found": raw + q(q="no-such-delivery-id"),
        "admin raw events, body text (an hour)": raw + q(body="cs_bench_424242"),
        "admin raw event": f"{raw}{sample['raw_id']}/change/",
        "admin deliveries": deliveries,
        "admin deliveries, page 50": deliveries + q(p=49),
        "admin deliveries, status dead": deliveries + q(status__exact="dead"),
        "admin deliveries, status done": deliveries + q(status__exact="done"),
        "admin deliveries, status held": deliveries + q(status__exact="held"),
        "admin deliveries, handler": deliveries + q(handler=HANDLERS["github"]),
        "admin deliveries, source renderer": deliveries + q(source="renderer"),
        "admin deliveries, search raw event": deliveries + q(q=str(sample["raw_id"])),
        "admin delivery": f"{deliveries}{sample['delivery']}/change/",
        "admin side effects": side_effects,
        "admin side effects, status dead": side_effects + q(status__exact="dead"),
        "admin side effect": f"{side_effects}{sample['side_effect']}/change/",
        "admin recaps": "/admin/recaps/recapvideo/",
        "admin recaps, status failed": "/admin/recaps/recapvideo/" + q(status__exact="failed"),
        "admin operator actions": "/admin/console/operatoraction/",
        "/ops/": "/ops/",
        "/ops/incidents/": "/ops/incidents/",
        "/ops/jobs/": "/ops/jobs/",
        "/ops/pauses/": "/ops/pauses/",
        "/ops/regions/": "/ops/regions/",
        "/metrics": "/metrics",
        "/api/queues/": "/api/queues/",
        "api raw events": "/api/raw-events/",
        "api raw events, status rejected": "/api/raw-events/" + q(status="rejected"),
        "api raw events, source renderer": "/api/raw-events/" + q(source="renderer"),
        "api raw events, delivery id": "/api/raw-events/" + q(delivery_id=sample["delivery_id"]),
        "api raw events, q delivery id": "/api/raw-events/" + q(q=sample["delivery_id"]),
        "api raw events, body text (an hour)": "/api/raw-events/"
        + q(body_contains="cs_bench_424242"),
        "api raw event": f"/api/raw-events/{sample['raw_id']}/",
        "api deliveries": "/api/deliveries/",
        "api deliveries, status dead": "/api/deliveries/" + q(status="dead"),
        "api deliveries, source renderer": "/api/deliveries/" + q(source="renderer"),
        "api delivery": f"/api/deliveries/{sample['delivery']}/",
        "api side effects": "/api/side-effects/",
        "api side effect": f"/api/side-effects/{sample['side_effect']}/",
        "api recaps": "/api/recaps/",
        "api recap": f"/api/recaps/{sample['recap']}/",
        "api operator actions": "/api/operator-actions/",
        "api jobs": "/api/jobs/",
        "api incidents": "/api/incidents/",
        "api pauses": "/api/pauses/",
        "api root": "/api/",
    }


def _clients():
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.test import Client

    users = get_user_model().objects
    admin = users.filter(username="bench-admin").first() or users.create_superuser("bench-admin")
    viewer = users.filter(username="bench-viewer").first()
    if viewer is None:
        viewer = users.create_user("bench-viewer", is_staff=True)
        for name in VIEW_PERMISSIONS:
            app_label, codename = name.split(".")
            viewer.user_permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )
    superuser, staff = Client(), Client()
    superuser.force_login(admin)
    staff.force_login(viewer)
    return {"superuser": superuser, "staff": staff}


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def time_pages(requests: int, only: str = "") -> list[dict]:
    clients = _clients()
    scraper = {"Authorization": f"Bearer {TOKEN}"}
    results = []
    for name, url in pages(_samples()).items():
        if only and only not in name:
            continue
        for who, client in clients.items():
            headers = scraper if url == "/metrics" and who == "superuser" else {}
            timings, status = [], 0
            for n in range(requests + 1):  # the first one warms up and is not counted
                started = time.perf_counter()
                status = client.get(url, headers=headers).status_code
                if n:
                    timings.append((time.perf_counter() - started) * 1000)
            results.append(
                {
                    "page": name,
                    "user": who,
                    "status": status,
                    "p50_ms": statistics.median(timings),
                    "p95_ms": _percentile(timings, 0.95),
                }
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--requests", type=int, default=7)
    parser.add_argument("--reuse", action="store_true", help="keep a store built at this size")
    parser.add_argument("--drop", action="store_true", help="drop the database at the end")
    parser.add_argument("--only", default="", help="time the pages whose name contains this")
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    if args.events < 1000:
        parser.error("--events must be at least 1000")

    rebuild = not (args.reuse and _built_size() == args.events)
    if rebuild:
        _recreate_database()
    _setup_django()
    from django.core.management import call_command
    from django.db import connection

    started = time.monotonic()
    call_command("migrate", verbosity=0)
    migrate_seconds = time.monotonic() - started
    fill = _fill(args.events, args.days) if rebuild else {}
    results = time_pages(args.requests, args.only)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_size_pretty(pg_database_size(current_database()))")
        size = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM ingress_delivery")
        deliveries = cursor.fetchone()[0]
    print(
        f"console at {args.events:,} raw events and {deliveries:,} deliveries over "
        f"{args.days} days ({size}); "
        + (f"filled in {fill['fill_seconds']:.0f} s; " if fill else "store reused; ")
        + f"migrate {migrate_seconds:.1f} s; {args.requests} GETs a page; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"{'page':<48} {'user':<10} {'status':>6} {'p50 ms':>8} {'p95 ms':>8}")
    for row in results:
        print(
            f"{row['page']:<48} {row['user']:<10} {row['status']:>6} "
            f"{row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f}"
        )
    worst = max(results, key=lambda row: row["p95_ms"])
    print(f"worst p95: {worst['page']} ({worst['user']}) {worst['p95_ms']:.1f} ms")
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"events": args.events, "deliveries": deliveries, "results": results})
        )
    if args.drop:
        connection.close()
        drop_database()


if __name__ == "__main__":
    main()
