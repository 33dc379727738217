"""Benchmark: how fast two (or N) real inbox workers drain a signed backlog, exactly once.

Not a test. It needs PostgreSQL (127.0.0.1:5432 unless --pg-port) and uses its own database
(`eventdrop_bench_inbox`), which it recreates. Each run:

1. loads a backlog of `--events` Stripe-signed events (a realistic ~1.6 KiB
   `payment_intent.succeeded` body, the headers Stripe sends, `--duplicates` of them provider
   redeliveries of an earlier event under a new signature) with one COPY, exactly as
   `raw_event_store` would have stored them, and ANALYZEs it — all in one transaction that
   stays open while
2. `--workers` worker processes start: the real `manage.py process_inbox`, the command the
   Procfile runs (settings: bench/settings_inbox.py, which adds the handler in
   bench/handlers.py — one small write per delivery, a row of its own table, as real
   handlers do). Once every worker is connected the backlog is committed and the clock
   starts; it stops when no raw event is pending and no delivery is pending or processing.
3. checks exactly-once: every distinct event verified and dispatched once, each duplicate
   pointing at its winner, one `done` delivery with one `done` attempt per event and handler,
   the handler's row committed exactly once per winner and handler and never for a duplicate,
   one dedup key per distinct event, nothing pending or processing left. Any violation is
   printed and the script exits non-zero.

    .venv/bin/python bench/inbox_throughput.py --events 50000 --workers 2 \\
        --ingress-json /tmp/ingress.json

`--ingress-json FILE` reads the ACK rate bench/ingress_ack.py measured in the same run
(`--json-out FILE`; the key `ack_per_s`) and prints the drain rate next to it with the ratio
(issue 15: the drain must be at least the ingress rate). When that file also has the pgbench
ceiling the ingress was measured against, the same ceiling is measured again before and
after each drain (the database bench/ingress_ack.py left, :5432), and the drain's share of
it is set against the ingress's share of its own: the ratio with this VM's minute-to-minute
speed taken out, printed beside the plain one. `--baseline REV` runs the workers
of every other run from `git archive REV` (or from REV, a directory holding an unpacked
tree) instead of the working tree (the same backlog, settings and handler, each side in a
database of its own migrated by its own tree: only the pipeline's code and schema differ),
alternating baseline and current, and prints each pair's ratio.
`--py-spy DIR` records each worker with py-spy (collapsed stacks, top frames printed;
`--py-spy-gil`: only samples holding the GIL, i.e. the workers' own CPU);
`--pg-stats` resets and prints pg_stat_statements (the server must preload it).
"""

import argparse
import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Recreated by every run: --database names another, so that two people can bench at once.
DB_NAME = os.environ.get(
    "EVENTDROP_BENCH_INBOX_DB",
    "eventdrop_bench_inbox" + os.environ.get("EVENTDROP_BENCH_DB_SUFFIX", ""),
)
SETTINGS = "bench.settings_inbox"
APP_NAME = "eventdrop-bench-inbox"  # PGAPPNAME of the workers' connections
MAX_SECONDS_PER_RUN = 900
# Each pgbench ceiling run around a drain, with --ingress-json (as bench/ingress_ack.py's).
CEILING_SECONDS = 10
# The bench's own files the workers run: a baseline revision gets this tree's, so that both
# sides deliver to the same handler and write the same table (the exactly-once checks read
# it), and only the pipeline's code differs.
BENCH_SUPPORT_FILES = (
    "bench/__init__.py",
    "bench/settings_inbox.py",
    "bench/handlers.py",
    "bench/models.py",
    "bench/migrations/__init__.py",
    "bench/migrations/0001_initial.py",
)


def _admin_url(port: int, db: str = "postgres") -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/{db}"


def _setup_django(port: int) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{port}/{DB_NAME}"
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django

    django.setup()


def _recreate_database(port: int) -> None:
    import psycopg

    with psycopg.connect(_admin_url(port), autocommit=True) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        db.execute(f'CREATE DATABASE "{DB_NAME}"')


# --- the backlog ---------------------------------------------------------------------------


def _stripe_body(event_id: str, n: int, created: int) -> bytes:
    """A payment_intent.succeeded event shaped like Stripe's (API 2024-06-20), ~1.6 KiB."""
    pi = f"pi_3Pbench{n:010d}"
    charge = f"ch_3Pbench{n:010d}"
    payload = {
        "id": event_id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": created,
        "data": {
            "object": {
                "id": pi,
                "object": "payment_intent",
                "amount": 1000 + n % 9000,
                "amount_capturable": 0,
                "amount_details": {"tip": {}},
                "amount_received": 1000 + n % 9000,
                "application": None,
                "automatic_payment_methods": {"allow_redirects": "never", "enabled": True},
                "capture_method": "automatic",
                "client_secret": f"{pi}_secret_{hashlib.sha256(pi.encode()).hexdigest()[:24]}",
                "confirmation_method": "automatic",
                "created": created - 2,
                "currency": "eur",
                "customer": f"cus_Bench{n % 5000:08d}",
                "description": "EventDrop recap video",
                "latest_charge": charge,
                "livemode": False,
                "metadata": {"recap_id": f"00000000-0000-4000-8000-{n:012d}", "plan": "recap"},
                "next_action": None,
                "on_behalf_of": None,
                "payment_method": f"pm_1Pbench{n:010d}",
                "payment_method_configuration_details": None,
                "payment_method_options": {
                    "card": {
                        "installments": None,
                        "mandate_options": None,
                        "network": None,
                        "request_three_d_secure": "automatic",
                    }
                },
                "payment_method_types": ["card"],
                "processing": None,
                "receipt_email": f"customer{n % 5000}@example.com",
                "review": None,
                "setup_future_usage": None,
                "shipping": None,
                "source": None,
                "statement_descriptor": None,
                "statement_descriptor_suffix": None,
                "status": "succeeded",
                "transfer_data": None,
                "transfer_group": None,
            }
        },
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": f"req_Bench{n:010d}", "idempotency_key": f"idem-{n:08d}-bench"},
        "type": "payment_intent.succeeded",
    }
    return json.dumps(payload, indent=2).encode()


def _is_duplicate(n: int, fraction: float) -> bool:
    """Spread evenly: event n is a redelivery when it crosses the next multiple of 1/fraction."""
    return n > 0 and int((n + 1) * fraction) > int(n * fraction)


def _backlog_rows(count: int, fraction: float, secret: str):
    """(fields…) per event in the column order of _BACKLOG_COLUMNS, and the distinct count."""
    from django.utils import timezone

    now = timezone.now()
    # Received over the last few minutes, in order, signed at arrival (the Stripe tolerance
    # is judged against received_at, so a slow drain never turns them stale).
    first = now - timedelta(seconds=120)
    step = timedelta(seconds=110) / count
    rows = []
    distinct = 0
    last_distinct = 0
    bodies: dict[int, bytes] = {}
    for n in range(count):
        received_at = first + step * n
        timestamp = int(received_at.timestamp())
        if _is_duplicate(n, fraction):
            body = bodies[last_distinct]  # the same event again, a new attempt's signature
        else:
            distinct += 1
            last_distinct = n
            body = _stripe_body(f"evt_1Pbench{n:010d}", n, timestamp - 1)
            bodies = {n: body}
        signed = f"{timestamp}.".encode() + body
        signature = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
        headers = {
            "host": "hooks.example.com",
            "user-agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
            "content-type": "application/json; charset=utf-8",
            "content-length": str(len(body)),
            "accept": "*/*; q=0.5, application/xml",
            "cache-control": "no-cache",
            "x-forwarded-for": "54.187.174.169",
            "x-forwarded-proto": "https",
            "stripe-signature": f"t={timestamp},v1={signature}",
        }
        rows.append((headers, body, received_at))
    return rows, distinct


_BACKLOG_COLUMNS = (
    "source",
    "provider",
    "method",
    "path",
    "query_string",
    "headers",
    "body",
    "body_encryption",
    "body_sha256",
    "remote_addr",
    "received_at",
    "delivery_id",
    "signature_status",
    "rejection_reason",
    "verify_count",
    "event_type",
    "provider_retry_reason",
    "dedup_key",
    "dispatch_status",
    "processing_failures",
    "processing_error",
    "origin",
)


def _load_backlog(loader, count: int, fraction: float) -> int:
    """COPY the backlog in the loader's open transaction; returns the distinct events.

    Each row holds what raw_event_store would have written for it (encrypt_request, the
    plaintext's hash, the model's defaults for the inbox's columns): the workers cannot tell
    it from received traffic. The transaction is committed by the caller.
    """
    from psycopg.types.json import Jsonb

    from bench.models import HandlerRun
    from ingress.encryption import encrypt_request
    from ingress.models import DedupKey, Delivery, DeliveryAttempt, RawEvent
    from ingress.sources import all_sources

    source = all_sources()["stripe"]
    secret = source.secrets[0]
    fields = {f.column: f for f in RawEvent._meta.concrete_fields}
    missing = [
        column
        for column, field in fields.items()
        if column not in _BACKLOG_COLUMNS and column != "id" and not _nullable(field)
    ]
    if missing:
        raise SystemExit(f"bench: the backlog does not fill {missing}: update _BACKLOG_COLUMNS")
    defaults = {column: fields[column].get_default() for column in _BACKLOG_COLUMNS}
    rows, distinct = _backlog_rows(count, fraction, secret)
    pipeline = (HandlerRun, DeliveryAttempt, Delivery, DedupKey, RawEvent)
    tables = ", ".join(m._meta.db_table for m in pipeline)
    with loader.cursor() as cursor:
        # TRUNCATE, not DELETE: a run must not inherit the previous run's dead tuples.
        cursor.execute(f"TRUNCATE {tables}")
        columns = ", ".join(_BACKLOG_COLUMNS)
        with cursor.copy(f"COPY {RawEvent._meta.db_table} ({columns}) FROM STDIN") as copy:
            for headers, body, received_at in rows:
                stored_body, stored_headers, body_encryption = encrypt_request(body, headers)
                values = {
                    **defaults,
                    "source": source.name,
                    "provider": source.provider,
                    "method": "POST",
                    "path": f"/webhooks/{source.name}/",
                    "headers": Jsonb(stored_headers),
                    "body": stored_body,
                    "body_encryption": body_encryption,
                    "body_sha256": hashlib.sha256(body).hexdigest(),
                    "remote_addr": "127.0.0.1",
                    "received_at": received_at,
                    "delivery_id": "",
                }
                copy.write_row([values[column] for column in _BACKLOG_COLUMNS])
        # What autovacuum would have done by the time a real backlog of this size is worked
        # off (ANALYZE counts this transaction's own uncommitted rows): the raw events only.
        # The just-truncated pipeline tables are left unanalysed, as autovacuum leaves a table
        # nobody wrote: analysed empty, they make the first plan of each worker's foreign-key
        # check (deliveryattempt -> delivery, one per attempt at COMMIT) a sequential scan that
        # stays cached while the table grows (--pg-stats shows it) — a cost no running system
        # pays, landing on one variant or the other.
        cursor.execute(f"ANALYZE {RawEvent._meta.db_table}")
    return distinct


def _nullable(field) -> bool:
    from django.db.models.fields import NOT_PROVIDED

    return field.null or field.db_default is not NOT_PROVIDED


# --- the workers ---------------------------------------------------------------------------


def _baseline_tree(revision: str) -> Path:
    """`git archive REV` unpacked in a temporary directory (or REV itself, a directory with a
    manage.py: an unpacked tree), with this tree's bench support files."""
    if (Path(revision) / "manage.py").exists():
        tree = Path(revision).resolve()
        _copy_support_files(tree)
        return tree
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree = Path(tempfile.gettempdir()) / f"eventdrop-inbox-baseline-{commit[:12]}"
    if not (tree / "manage.py").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    _copy_support_files(tree)
    return tree


def _copy_support_files(tree: Path) -> None:
    for name in BENCH_SUPPORT_FILES:
        target = tree / name
        if target.exists() and target.samefile(ROOT / name):
            continue  # --baseline . (two settings of this very tree)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, target)


def _worker_env(port: int, batch_size: int | None, handlers: int) -> dict[str, str]:
    env = {
        **os.environ,
        "EVENTDROP_BENCH_HANDLERS": str(handlers),
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{port}/{DB_NAME}",
        "PGAPPNAME": APP_NAME,
        # Only the wait before the backlog is committed: a worker with work never sleeps.
        "INBOX_IDLE_SLEEP_SECONDS": "0.05",
    }
    env.pop("PYTHONPATH", None)
    if batch_size:
        env["INBOX_BATCH_SIZE"] = str(batch_size)
    return env


def _wait_for_workers(cursor, procs, workers: int, log_dir: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for i, proc in enumerate(procs):
            if proc.poll() is not None:
                log = (log_dir / f"worker-{i}.log").read_text()[-3000:]
                raise SystemExit(f"bench: worker {i} exited with {proc.returncode}:\n{log}")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (DB_NAME, APP_NAME),
        )
        if _scalar(cursor) >= workers:
            time.sleep(0.3)  # their first (idle) pass, on a snapshot without the backlog
            return
        time.sleep(0.05)
    raise SystemExit("bench: the workers did not connect within 60 s")


def _run(args, tree: Path, label: str) -> dict:
    import psycopg

    url = _admin_url(args.pg_port, DB_NAME)
    log_dir = Path(tempfile.mkdtemp(prefix="inbox-bench-"))
    with psycopg.connect(url) as loader, psycopg.connect(url, autocommit=True) as watcher:
        loaded = time.monotonic()
        distinct = _load_backlog(loader, args.events, args.duplicates)
        load_seconds = time.monotonic() - loaded
        env = _worker_env(args.pg_port, args.batch_size, args.handlers)
        procs = []
        for i in range(args.workers):
            log = (log_dir / f"worker-{i}.log").open("w")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "manage.py", "process_inbox"],
                    cwd=tree,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        spies = []
        try:
            with watcher.cursor() as cursor:
                _wait_for_workers(cursor, procs, args.workers, log_dir)
                if args.pg_stats:
                    cursor.execute("SELECT pg_stat_statements_reset()")
                cpu = _CpuMeter(cursor, [proc.pid for proc in procs])
                loader.commit()
                started = time.monotonic()
                if args.py_spy:
                    spies = _start_spies(args.py_spy, procs, label, on_cpu=args.py_spy_gil)
                done_at = None
                while time.monotonic() - started < MAX_SECONDS_PER_RUN:
                    cpu.sample()
                    cursor.execute(
                        "SELECT EXISTS (SELECT 1 FROM ingress_rawevent"
                        "  WHERE signature_status = 'pending')"
                        " OR EXISTS (SELECT 1 FROM ingress_delivery"
                        "  WHERE status IN ('pending', 'processing'))"
                    )
                    if not _scalar(cursor):
                        done_at = time.monotonic()
                        cpu.sample()
                        break
                    time.sleep(0.05)
        finally:
            for spy in spies:
                spy.send_signal(signal.SIGINT)
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for spy in spies:
                spy.wait(timeout=30)
        pg_top = _pg_top(watcher) if args.pg_stats else []
        violations = [] if done_at else ["backlog not drained within the time limit"]
        violations += _exactly_once_violations(watcher, args.events, distinct, args.handlers)
    elapsed = (done_at or time.monotonic()) - started
    result = {
        "label": label,
        "workers": args.workers,
        "events": args.events,
        "distinct": distinct,
        "load_seconds": load_seconds,
        "seconds": elapsed,
        "events_per_s": args.events / elapsed,
        # CPU per event, the workers' and their PostgreSQL backends': what the code costs,
        # and far steadier than the wall clock on a machine shared with other work.
        "worker_cpu_ms_per_event": 1000 * cpu.workers / args.events,
        "backend_cpu_ms_per_event": 1000 * cpu.backends / args.events,
        "violations": violations,
        "pg_top": pg_top,
        "logs": str(log_dir),
    }
    if args.py_spy:
        result["spy_top"] = _spy_top(Path(args.py_spy), label)
    return result


class _CpuMeter:
    """CPU seconds (user + system, from /proc) the worker processes and their PostgreSQL
    backends spent since the meter was made. Backends are found by PGAPPNAME and sampled
    while the run lasts: a worker reconnects after CONN_MAX_AGE, and a backend that went
    keeps its last reading. Needs PostgreSQL on this machine (127.0.0.1), as the bench does;
    elsewhere the backends read 0."""

    def __init__(self, cursor, worker_pids: list[int]) -> None:
        self.cursor = cursor
        self.worker_start = {pid: _cpu_seconds(pid) for pid in worker_pids}
        self.worker_last = dict(self.worker_start)
        self.backend_start: dict[int, float] = {}
        self.backend_last: dict[int, float] = {}
        self.sample()
        self.backend_start = dict(self.backend_last)

    def sample(self) -> None:
        for pid in self.worker_last:
            self.worker_last[pid] = _cpu_seconds(pid) or self.worker_last[pid]
        self.cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (DB_NAME, APP_NAME),
        )
        for (pid,) in self.cursor.fetchall():
            seconds = _cpu_seconds(pid)
            self.backend_last[pid] = max(seconds, self.backend_last.get(pid, 0.0))
            self.backend_start.setdefault(pid, 0.0)

    @property
    def workers(self) -> float:
        return sum(self.worker_last[pid] - self.worker_start[pid] for pid in self.worker_last)

    @property
    def backends(self) -> float:
        return sum(self.backend_last[pid] - self.backend_start[pid] for pid in self.backend_last)


def _scalar(cursor):
    row = cursor.fetchone()
    assert row is not None, "a one-row query returned no row"
    return row[0]


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    # utime and stime, fields 14 and 15 of proc(5), counted after the ")" closing comm
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- exactly once --------------------------------------------------------------------------

_CHECKS = {
    # name: (SQL returning one number, what it must be: see _exactly_once_violations)
    "raw events stored": ("SELECT count(*) FROM ingress_rawevent", "events"),
    "raw events not verified": (
        "SELECT count(*) FROM ingress_rawevent WHERE signature_status <> 'verified'",
        0,
    ),
    "events dispatched (no_handler when there is none)": (
        "SELECT count(*) FROM ingress_rawevent WHERE dispatch_status = %(routed)s",
        "distinct",
    ),
    "events marked duplicate": (
        "SELECT count(*) FROM ingress_rawevent WHERE dispatch_status = 'duplicate'",
        "dups",
    ),
    "duplicates not pointing at a winner with their key": (
        "SELECT count(*) FROM ingress_rawevent d WHERE d.dispatch_status = 'duplicate'"
        " AND NOT EXISTS (SELECT 1 FROM ingress_rawevent w WHERE w.id = d.duplicate_of_id"
        "  AND w.dispatch_status = %(routed)s AND w.dedup_key = d.dedup_key)",
        0,
    ),
    "dedup keys": ("SELECT count(*) FROM ingress_dedupkey", "distinct"),
    "dedup keys not naming their winner": (
        "SELECT count(*) FROM ingress_dedupkey k WHERE NOT EXISTS (SELECT 1 FROM"
        " ingress_rawevent w WHERE w.id = k.raw_event_id AND w.dispatch_status = %(routed)s"
        " AND w.dedup_key = k.key)",
        0,
    ),
    "deliveries done": (
        "SELECT count(*) FROM ingress_delivery WHERE status = 'done'",
        "deliveries",
    ),
    "deliveries not done": ("SELECT count(*) FROM ingress_delivery WHERE status <> 'done'", 0),
    "winners without exactly one done delivery per handler": (
        "SELECT count(*) FROM ingress_rawevent e WHERE e.dispatch_status = %(routed)s AND"
        " (SELECT count(DISTINCT handler) || '/' || count(*) FROM ingress_delivery d"
        "  WHERE d.raw_event_id = e.id AND d.status = 'done') <> %(per_event)s",
        0,
    ),
    "deliveries of duplicates": (
        "SELECT count(*) FROM ingress_delivery d JOIN ingress_rawevent e"
        " ON e.id = d.raw_event_id WHERE e.dispatch_status = 'duplicate'",
        0,
    ),
    "deliveries without exactly one attempt, done": (
        "SELECT count(*) FROM ingress_delivery d WHERE d.attempts <> 1 OR d.total_attempts <> 1"
        " OR (SELECT count(*) FILTER (WHERE outcome = 'done') || '/' || count(*)"
        "  FROM ingress_deliveryattempt a WHERE a.delivery_id = d.id) <> '1/1'",
        0,
    ),
    "winners whose handlers did not each commit exactly once": (
        "SELECT count(*) FROM ingress_rawevent e LEFT JOIN (SELECT raw_event_id,"
        " count(DISTINCT handler) || '/' || count(*) AS runs FROM bench_handlerrun"
        " GROUP BY raw_event_id) r ON r.raw_event_id = e.id"
        " WHERE e.dispatch_status = %(routed)s AND coalesce(r.runs, '0/0') <> %(per_event)s",
        0,
    ),
    "handler runs": ("SELECT count(*) FROM bench_handlerrun", "deliveries"),
    "handler runs for no delivered event (a duplicate's, or none)": (
        "SELECT count(*) FROM bench_handlerrun r WHERE NOT EXISTS (SELECT 1 FROM"
        " ingress_rawevent e WHERE e.id = r.raw_event_id AND e.dispatch_status = 'dispatched')",
        0,
    ),
    "winners not stamped handled": (
        "SELECT count(*) FROM ingress_rawevent WHERE dispatch_status = 'dispatched'"
        " AND handled_at IS NULL",
        0,
    ),
}


def _exactly_once_violations(watcher, events: int, distinct: int, handlers: int) -> list[str]:
    expected = {
        "events": events,
        "distinct": distinct,
        "dups": events - distinct,
        "deliveries": distinct * handlers,
        0: 0,
    }
    params = {
        "routed": "dispatched" if handlers else "no_handler",
        "per_event": f"{handlers}/{handlers}" if handlers else "0/0",
    }
    violations = []
    with watcher.cursor() as cursor:
        for name, (sql, want) in _CHECKS.items():
            cursor.execute(sql, params)
            got = _scalar(cursor)
            if got != expected[want]:
                violations.append(f"{name}: {got}, expected {expected[want]}")
    return violations


# --- profiles ------------------------------------------------------------------------------


def _start_spies(directory: str, procs, label: str, *, on_cpu: bool) -> list:
    Path(directory).mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    return [
        subprocess.Popen(
            [
                str(spy),
                "record",
                "--pid",
                str(proc.pid),
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(Path(directory) / f"{label}-worker-{i}.txt"),
                "--nonblocking",
                # Only samples holding the GIL: the workers' own CPU, not their waits for
                # PostgreSQL (which psycopg's C wait makes look busy to py-spy).
                *(["--gil"] if on_cpu else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, proc in enumerate(procs)
    ]


def _spy_top(directory: Path, label: str, top: int = 25) -> list[tuple[str, float, float]]:
    """(frame, inclusive %, self %) over every worker's collapsed stacks, idle included."""
    inclusive: Counter = Counter()
    own: Counter = Counter()
    total = 0
    for path in directory.glob(f"{label}-worker-*.txt"):
        for line in path.read_text().splitlines():
            stack, _, samples = line.rpartition(" ")
            if not stack:
                continue
            count = int(samples)
            total += count
            frames = stack.split(";")
            for frame in set(frames):
                inclusive[frame] += count
            own[frames[-1]] += count
    if not total:
        return []
    return [
        (frame, 100 * count / total, 100 * own[frame] / total)
        for frame, count in inclusive.most_common(top)
    ]


def _pg_top(watcher, top: int = 12) -> list[tuple]:
    with watcher.cursor() as cursor:
        cursor.execute(
            "SELECT calls, round(total_exec_time::numeric, 0), round(mean_exec_time::numeric, 3),"
            " rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 160)"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
            " WHERE datname = %s) ORDER BY total_exec_time DESC LIMIT %s",
            (DB_NAME, top),
        )
        return cursor.fetchall()


# --- main ----------------------------------------------------------------------------------


def _ingress_ceiling(path: str) -> dict | None:
    """The pgbench ceiling bench/ingress_ack.py measured with the ACK rate, if it did."""
    figures = json.loads(Path(path).read_text())
    if not isinstance(figures.get("ceiling_per_s"), int | float):
        return None
    return {key: figures[key] for key in ("ceiling_per_s", "ceiling_protocol", "connections")}


def _ceiling_now(ingress_ceiling: dict) -> float:
    """The same ceiling again, now (in bench/ingress_ack.py's database): this VM's speed
    moves by tens of per cent from one minute to the next, and the drain runs minutes after
    the ingress was measured."""
    from bench.ingress_ack import pgbench_ceiling

    return pgbench_ceiling(
        ingress_ceiling["connections"], CEILING_SECONDS, ingress_ceiling["ceiling_protocol"]
    )


def _ingress_ack_rate(path: str) -> float:
    def find(node):
        if isinstance(node, dict):
            if isinstance(node.get("ack_per_s"), int | float):
                return float(node["ack_per_s"])
            for value in node.values():
                if (found := find(value)) is not None:
                    return found
        if isinstance(node, list):
            for value in node:
                if (found := find(value)) is not None:
                    return found
        return None

    rate = find(json.loads(Path(path).read_text()))
    if rate is None:
        raise SystemExit(f"bench: no ack_per_s in {path}")
    return rate


def main() -> int:
    global DB_NAME
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--duplicates", type=float, default=0.02, help="fraction, 0..0.5")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=None, help="INBOX_BATCH_SIZE")
    parser.add_argument(
        "--handlers", type=int, default=1, help="handlers per event (0: verify and dedup only)"
    )
    parser.add_argument("--ingress-json", default=None, metavar="FILE")
    parser.add_argument("--baseline", default=None, metavar="REV")
    parser.add_argument("--py-spy", default=None, metavar="DIR")
    parser.add_argument(
        "--py-spy-gil", action="store_true", help="--py-spy: only samples holding the GIL"
    )
    parser.add_argument("--pg-stats", action="store_true")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument(
        "--database", default=DB_NAME, help="database to (re)create and use (dropped first!)"
    )
    parser.add_argument("--json-out", default=None, metavar="FILE")
    args = parser.parse_args()
    if not 1 <= args.events <= 500_000:
        parser.error("--events must be between 1 and 500000")
    if not 0 <= args.duplicates <= 0.5:
        parser.error("--duplicates must be between 0 and 0.5")
    if not 1 <= args.workers <= 16:
        parser.error("--workers must be between 1 and 16")
    if not 0 <= args.handlers <= 8:
        parser.error("--handlers must be between 0 and 8")
    if args.py_spy and not Path(sys.executable).with_name("py-spy").exists():
        pip = Path(sys.executable).with_name("pip")
        parser.error(f"--py-spy needs py-spy: {pip} install py-spy")
    ack = _ingress_ack_rate(args.ingress_json) if args.ingress_json else None
    ingress_ceiling = _ingress_ceiling(args.ingress_json) if args.ingress_json else None
    if ingress_ceiling is not None and args.pg_port != 5432:
        print("bench: the ingress ceiling was measured on :5432; drain not normalised")
        ingress_ceiling = None
    DB_NAME = args.database

    variants = [("current", ROOT)]
    if args.baseline:
        variants = [("baseline", _baseline_tree(args.baseline)), ("current", ROOT)]
    # A database per side, migrated by its own tree: a baseline from before a migration
    # runs on the schema it was written for.
    databases = {label: f"{args.database}_{label}" for label, _ in variants}
    databases["current"] = args.database
    for label, tree in variants:
        DB_NAME = databases[label]
        _recreate_database(args.pg_port)
        env = _worker_env(args.pg_port, args.batch_size, args.handlers)
        # As the Procfile's release phase does: the schema, and the day partitions the
        # backlog lands in.
        for command in (["migrate", "-v", "0"], ["raw_event_partitions"]):
            subprocess.run(
                [sys.executable, "manage.py", *command],
                cwd=tree,
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
                timeout=600,
            )
    DB_NAME = databases["current"]
    _setup_django(args.pg_port)

    results = []
    for round_no in range(args.rounds):
        # Alternate which variant goes first, so neither always gets the warmer cache.
        order = variants if round_no % 2 == 0 else variants[::-1]
        for label, tree in order:
            DB_NAME = databases[label]
            before = _ceiling_now(ingress_ceiling) if ingress_ceiling is not None else None
            result = _run(args, tree, label)
            if ingress_ceiling is not None and before is not None:
                result["ceiling_per_s"] = (before + _ceiling_now(ingress_ceiling)) / 2
            result["round"] = round_no + 1
            results.append(result)
            _print_run(result)

    print()
    print(
        f"inbox drain: {args.events} signed events ({args.duplicates:.0%} duplicates), "
        f"{args.workers} x manage.py process_inbox, PostgreSQL :{args.pg_port}"
        + f", {args.handlers} handler(s) per event"
        + (f", INBOX_BATCH_SIZE={args.batch_size}" if args.batch_size else "")
    )
    print(
        f"{'round':>5} {'code':>9} {'load s':>7} {'drain s':>8} {'events/s':>9} "
        f"{'worker CPU ms/ev':>17} {'pg CPU ms/ev':>13}  exactly once"
    )
    for r in results:
        verdict = "yes" if not r["violations"] else f"NO ({len(r['violations'])} violations)"
        print(
            f"{r['round']:>5} {r['label']:>9} {r['load_seconds']:>7.1f} {r['seconds']:>8.1f} "
            f"{r['events_per_s']:>9.0f} {r['worker_cpu_ms_per_event']:>17.3f} "
            f"{r['backend_cpu_ms_per_event']:>13.3f}  {verdict}"
        )
    if args.baseline:
        by_round: dict[int, dict[str, dict]] = {}
        for r in results:
            by_round.setdefault(r["round"], {})[r["label"]] = r
        for key, what in (
            ("events_per_s", "events/s"),
            ("worker_cpu_ms_per_event", "worker CPU per event"),
            ("backend_cpu_ms_per_event", "PostgreSQL CPU per event"),
        ):
            ratios = [
                f"{runs['current'][key] / runs['baseline'][key]:.2f}"
                for runs in by_round.values()
                if runs["baseline"][key]
            ]
            print(f"current / baseline ({args.baseline}), {what}, per round: {', '.join(ratios)}")
    if ack is not None:
        for r in results:
            print(
                f"round {r['round']} {r['label']}: drain {r['events_per_s']:.0f} events/s vs "
                f"ingress {ack:.0f} ACK/s ({args.ingress_json}): ratio "
                f"{r['events_per_s'] / ack:.2f} (goal >= 1.00)"
            )
            if ingress_ceiling is not None:
                # The machine's speed at each moment as the yardstick: the same pgbench
                # INSERT ceiling, measured around the drain as around the ingress.
                drain_share = r["events_per_s"] / r["ceiling_per_s"]
                ack_share = ack / ingress_ceiling["ceiling_per_s"]
                print(
                    f"round {r['round']} {r['label']}: drain {drain_share:.3f} of the pgbench "
                    f"ceiling around it ({r['ceiling_per_s']:.0f}/s), ingress {ack_share:.3f} of "
                    f"its own ({ingress_ceiling['ceiling_per_s']:.0f}/s): ratio "
                    f"{drain_share / ack_share:.2f}, the machine's speed taken out"
                )
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"ack_per_s": ack, "runs": results}, indent=2, default=str)
        )
    return 1 if any(r["violations"] for r in results) else 0


def _print_run(r: dict) -> None:
    print(
        f"round {r.get('round')} {r['label']}: {r['events']} events ({r['distinct']} distinct) "
        f"drained in {r['seconds']:.1f} s = {r['events_per_s']:.0f} events/s "
        f"(load {r['load_seconds']:.1f} s; CPU per event: workers "
        f"{r['worker_cpu_ms_per_event']:.3f} ms, "
        f"PostgreSQL {r['backend_cpu_ms_per_event']:.3f} ms; "
        f"worker logs {r['logs']})",
        flush=True,
    )
    for violation in r["violations"]:
        print(f"  VIOLATION {violation}", flush=True)
    for calls, total_ms, mean_ms, rows, query in r["pg_top"]:
        print(f"  pg {total_ms:>8} ms {calls:>7} calls {mean_ms:>8} ms/call {rows:>8} rows {query}")
    for frame, inclusive, own in r.get("spy_top", []):
        print(f"  spy {inclusive:5.1f} % incl {own:5.1f} % self  {frame}")


if __name__ == "__main__":
    sys.exit(main())
