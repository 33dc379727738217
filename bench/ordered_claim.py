"""The ordered claim's head query at a large ordered backlog (issue 13, H3's open limit).

    .venv/bin/python bench/ordered_claim.py --deliveries 20000 --keys 200

A fresh database on 127.0.0.1:5432 (eventdrop_bench_ordered), migrated, then --deliveries
unfinished deliveries of one ordered handler over --keys keys (pending, due, one running
per key when --running), plus 500 due unordered ones. Times, --passes times each, the claim's
key-head read before (ingress.deliveries.statements.KEY_HEADS, a sorted read of every unfinished
ordered delivery) and after (ordering.key_head_candidates: a skip scan of the keys, that sorted
read past SKIP_SCAN_MAX_KEYS keys) and the unordered claim's candidate read, and prints one
JSON object (median and max milliseconds). Read-only: each
pass's statements are the claim's reads, nothing is claimed.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DB_NAME = "eventdrop_bench_ordered" + os.environ.get("EVENTDROP_BENCH_DB_SUFFIX", "")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deliveries", type=int, default=20000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--running", action="store_true", help="one delivery per key running")
    parser.add_argument("--vacuum", action="store_true", help="VACUUM after loading")
    parser.add_argument("--port", type=int, default=5432)
    args = parser.parse_args()

    env = {**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:{args.port}/{DB_NAME}"}
    env.setdefault("DJANGO_SETTINGS_MODULE", "eventdrop.settings_test")
    subprocess.run(
        [
            "dropdb",
            "-h",
            "127.0.0.1",
            "-p",
            str(args.port),
            "-U",
            "postgres",
            "--if-exists",
            DB_NAME,
        ],
        check=True,
        env=env,
    )
    subprocess.run(
        ["createdb", "-h", "127.0.0.1", "-p", str(args.port), "-U", "postgres", DB_NAME],
        check=True,
        env=env,
    )
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=600
    )
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection
    from django.utils import timezone

    from ingress.deliveries.ordering import SKIP_SCAN_MAX_KEYS, key_head_candidates
    from ingress.deliveries.statements import KEY_HEADS, KEY_HEADS_SKIP_SCAN
    from kernel.queue import statement

    _KEY_HEADS = statement(KEY_HEADS, "ingress_delivery")
    _KEY_HEADS_SKIP_SCAN = statement(KEY_HEADS_SKIP_SCAN, "ingress_delivery")

    with connection.cursor() as cursor:
        # Every key's deliveries: event times one second apart; received order = id order.
        cursor.execute(
            "INSERT INTO ingress_delivery (raw_event_id, handler, status, attempts,"
            " total_attempts, next_attempt_at, claimed_at, last_error, created_at,"
            " ordering_key, event_time, forced) "
            "SELECT n, 'bench.ordered', CASE WHEN %s AND n <= %s THEN 'processing'"
            " ELSE 'pending' END, 0, 0, now() - interval '1 hour' + n * interval '1 ms',"
            " CASE WHEN %s AND n <= %s THEN now() END, '', now(), 'key_' || (n %% %s),"
            " timestamptz '2026-01-01' + n * interval '1 second', false "
            "FROM generate_series(1, %s) AS n",
            [args.running, args.keys, args.running, args.keys, args.keys, args.deliveries],
        )
        cursor.execute(
            "INSERT INTO ingress_delivery (raw_event_id, handler, status, attempts,"
            " total_attempts, next_attempt_at, last_error, created_at, ordering_key, forced) "
            "SELECT 10000000 + n, 'bench.unordered', 'pending', 0, 0, now(), '', now(), '',"
            " false FROM generate_series(1, 500) AS n"
        )
        # --vacuum: a backlog that waits untouched is all-visible once autovacuum has been
        # by (index-only scans); without, every entry costs a heap fetch (just written).
        cursor.execute(f"{'VACUUM ' if args.vacuum else ''}ANALYZE ingress_delivery")

    def timed(sql: str, params: list) -> dict[str, float]:
        spent = []
        with connection.cursor() as cursor:
            for _ in range(args.passes):
                started = time.perf_counter()
                cursor.execute(sql, params)
                cursor.fetchall()
                spent.append((time.perf_counter() - started) * 1000)
        return {"median_ms": round(statistics.median(spent), 2), "max_ms": round(max(spent), 2)}

    now = timezone.now()
    unordered = (
        "SELECT id FROM ingress_delivery WHERE status = 'pending' AND next_attempt_at <= %s"
        " AND ordering_key = '' ORDER BY next_attempt_at LIMIT %s"
    )

    def claim_reads() -> dict[str, float]:
        spent = []
        with connection.cursor() as cursor:
            for _ in range(args.passes):
                started = time.perf_counter()
                key_head_candidates(cursor, 100, now)
                spent.append((time.perf_counter() - started) * 1000)
        return {"median_ms": round(statistics.median(spent), 2), "max_ms": round(max(spent), 2)}

    before = {"key_heads_sorted": timed(_KEY_HEADS, [now, 100])}
    after = {
        "key_heads_claim": claim_reads(),  # skip scan, or the sorted read past the key cap
        "skip_scan_alone": timed(_KEY_HEADS_SKIP_SCAN, [SKIP_SCAN_MAX_KEYS, now]),
        "unordered_candidates": timed(unordered, [now, 100]),
    }
    print(
        json.dumps(
            {
                "deliveries": args.deliveries,
                "keys": args.keys,
                "running": args.running,
                "vacuum": args.vacuum,
                "before": before,
                "after": after,
            }
        )
    )


if __name__ == "__main__":
    main()
