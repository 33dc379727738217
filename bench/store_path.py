"""Benchmark: the webhook's store path with and without the client-side database bounds.

Not a test. It needs PostgreSQL on 127.0.0.1:5432 and uses its own database
(`eventdrop_bench_store`), created and migrated on first use and emptied before each run.
Each round runs two child processes, in alternating order, that store the same ~1 KiB body
`--calls` times, each call framed the way a request frames it (Django's request_started /
request_finished connection handling around it):

- `before`: Django's stock PostgreSQL backend, no health check, the bare INSERT
  (`RawEvent.objects.create`), which is what the receive path did before issue 8;
- `after`: our backend (kernel.db.postgresql: the bounded psycopg wait, the poll(2)
  health check once per request) and `raw_event_store` (its deadline and the retry guard).

It prints the median and p99 per call of every round and the ratio of the medians.

    .venv/bin/python bench/store_path.py --calls 2000 --rounds 3
"""

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "eventdrop_bench_store" + os.environ.get("EVENTDROP_BENCH_DB_SUFFIX", "")
SERVER_URL = "postgres://postgres@127.0.0.1:5432"
BODY = (b'{"id": "evt_bench", "object": "event", "type": "checkout.session.completed", '
        b'"data": {"object": {"id": "cs_test", "amount_total": 1900, "currency": "eur", '
        b'"metadata": {"recap_id": "7"}, "padding": "' + b"x" * 800 + b'"}}}')


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=f"{SERVER_URL}/{DB_NAME}",
        DJANGO_SETTINGS_MODULE="eventdrop.settings",
        DJANGO_DEBUG="0",
        # A developer's .env must not fill in what the benchmark left out on purpose.
        PYTHON_DOTENV_DISABLED="1",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        STRIPE_WEBHOOK_SECRET="whsec_bench_" + secrets.token_hex(16),
    )
    return env


def prepare() -> None:
    import psycopg

    sys.path.insert(0, str(ROOT))  # this checkout's bench package
    from bench import reusable_database

    manage = [sys.executable, "manage.py"]

    def migrate() -> None:
        for args in (["migrate", "--noinput", "--skip-checks", "-v0"],
                     ["raw_event_partitions", "--skip-checks"]):
            subprocess.run([*manage, *args], env=child_env(), cwd=ROOT, check=True,
                           capture_output=True)

    reusable_database(SERVER_URL, DB_NAME, migrate)
    with psycopg.connect(f"{SERVER_URL}/{DB_NAME}", autocommit=True) as conn:
        conn.execute("TRUNCATE ingress_rawevent CASCADE")


def child(variant: str, calls: int) -> None:
    sys.path.insert(0, str(ROOT))
    import django
    from django.conf import settings

    if variant == "before":
        # The configuration before issue 8: stock backend, no health check, no client bound.
        database = settings.DATABASES["default"]
        database["ENGINE"] = "django.db.backends.postgresql"
        database["CONN_HEALTH_CHECKS"] = False
        database["OPTIONS"].pop("client_wait_timeout")
    django.setup()

    from django.db import close_old_connections

    from ingress.models import RawEvent
    from ingress.services import raw_event_store
    from ingress.sources import all_sources

    source = all_sources()["stripe"]
    headers = {"content-type": "application/json", "stripe-signature": "t=1,v1=00"}

    def store_before() -> None:
        RawEvent.objects.create(
            source=source.name, provider=source.provider, method="POST",
            path="/webhooks/stripe/", query_string="", headers=headers, body=BODY,
            body_sha256="0" * 64, remote_addr="127.0.0.1", delivery_id="",
        )

    def store_after() -> None:
        raw_event_store(
            source=source, method="POST", path="/webhooks/stripe/", query_string="",
            headers=headers, body=BODY, remote_addr="127.0.0.1",
        )

    store = store_before if variant == "before" else store_after
    for _ in range(200):  # warm-up: connection, statement cache, partition
        close_old_connections()
        store()
        close_old_connections()
    samples = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        close_old_connections()  # request_started
        store()
        close_old_connections()  # request_finished
        samples.append((time.perf_counter_ns() - started) / 1000)
    samples.sort()
    print(json.dumps({"median_us": statistics.median(samples),
                      "p99_us": samples[int(len(samples) * 0.99) - 1]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["before", "after"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.calls)
        return
    prepare()
    medians: dict[str, list[float]] = {"before": [], "after": []}
    for round_number in range(args.rounds):
        order = ("before", "after") if round_number % 2 == 0 else ("after", "before")
        for variant in order:
            result = subprocess.run(
                [sys.executable, __file__, "--child", variant, "--calls", str(args.calls)],
                env=child_env(), cwd=ROOT, check=True, capture_output=True, text=True,
            )
            figures = json.loads(result.stdout.strip().splitlines()[-1])
            medians[variant].append(figures["median_us"])
            print(f"round {round_number + 1} {variant:6}: median {figures['median_us']:7.1f} µs"
                  f"  p99 {figures['p99_us']:7.1f} µs")
    before, after = statistics.median(medians["before"]), statistics.median(medians["after"])
    print(f"median of medians: before {before:.1f} µs, after {after:.1f} µs, "
          f"after/before {after / before:.3f}")


if __name__ == "__main__":
    main()
