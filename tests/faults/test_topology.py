"""The production topology on one machine, as separate OS processes (issue 14, part 4).

    PostgreSQL primary ── streaming replica (pg_basebackup -R)
        │                     │
    PgBouncer (transaction) PgBouncer (transaction)      Redis (django-q2 broker)
        │                     │                              │
    2 web servers (the Procfile's `web`), 2 inbox workers (`inbox`), 2 dispatchers
    (`dispatch_side_effects`), 2 django-q2 clusters (`worker`, Q_BROKER=redis); the web
    servers' read-only screens read through the replica's PgBouncer. The fake render service
    renders and calls back, signed, through the web servers.

A burst of signed events across sources (tests/faults/burst.py, a separate process, retrying
like a provider, paced to at most BURST_RATE events a second), with paid recaps spread through
it. During the burst one web server, one inbox worker, one dispatcher and one django-q2
cluster are SIGKILLed, one after the other, and each is restarted at once. The kills follow
the burst's progress, not the clock: the k-th waits until the raw-event table holds k fifths
of the burst's events, so each lands while the burst runs, however fast the machine is.
Afterwards, from the rows:

- every event was acknowledged; each logical event is stored as one verified event (a
  retried request whose 202 was lost is a `duplicate` of it), none rejected, none pending;
- every delivery is done, once (one delivery per event and handler, none dead or left
  processing), every paid recap is `ready`, its side effect `done`, and the fake render
  service accepted exactly one render per recap (retries replayed the idempotency key);
- /metrics answered during the burst, its reads served by the replica.

Size: TOPOLOGY_EVENTS, default 20,000 (the issue's figure) plus 30 paid recaps. Every wait
is bounded (the burst by BURST_SECONDS, the drain by DRAIN_SECONDS) and, when it gives up,
says what it saw: rows stored, events verified, work still waiting.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest

from tests.faults.servers import pgbouncer, redis_server
from tests.support.pg_cluster import replica_of, throwaway_cluster
from tests.support.processes import (
    Managed,
    app_env,
    free_port,
    manage,
    migrate,
    start_manage,
    start_procfile,
)

pytestmark = pytest.mark.faults

EVENTS = int(os.environ.get("TOPOLOGY_EVENTS", "20000"))
RECAPS = 30
# A ceiling, not a target: the burst takes at least EVENTS / BURST_RATE seconds, so a machine
# faster than this one still has the load running while each kill's replacement starts.
BURST_RATE = 500
BURST_SECONDS = 240
DRAIN_SECONDS = 120
KILLED = ("web1", "inbox1", "dispatcher1", "worker1")
METRICS_TOKEN = "topology-metrics-token-0123456789"
BURST = Path(__file__).with_name("burst.py")

CREATE_RECAPS = f"""
import json
from tests.recaps.factories import RecapFactory
print("RECAPS " + json.dumps([str(RecapFactory().id) for _ in range({RECAPS})]))
"""


def query(url: str, sql: str):
    with psycopg.connect(url, connect_timeout=10) as conn:
        return conn.execute(sql).fetchall()


def scalar(url: str, sql: str):
    return query(url, sql)[0][0]


class Fleet:
    """The named processes, each restartable with the command it was started with."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.processes: dict[str, Managed] = {}
        self.starters: dict[str, object] = {}
        self.generation: dict[str, int] = {}

    def start(self, name: str, starter) -> Managed:
        self.starters[name] = starter
        generation = self.generation.get(name, 0) + 1
        self.generation[name] = generation
        process = starter(self.workdir / f"{name}.{generation}.log")
        self.processes[name] = process
        return process

    def kill_and_restart(self, name: str) -> Managed:
        killed = self.processes[name]
        killed.kill()
        killed.stop(grace=1)  # already dead: only reaps the group and closes its log
        return self.start(name, self.starters[name])

    def stop_all(self) -> None:
        for process in self.processes.values():
            process.stop(grace=5)

    def dead(self) -> list[str]:
        return [
            name
            for name, process in self.processes.items()
            if name != "burst" and not process.alive
        ]


def test_the_production_topology_keeps_every_promise_through_kills(tmp_path):
    with (
        throwaway_cluster(prefix="edtopo") as primary,
        redis_server() as redis,
    ):
        direct = primary.createdb("eventdrop")
        migrate(app_env(direct))
        created = manage("shell", "-c", CREATE_RECAPS, env=app_env(direct)).stdout
        recaps = json.loads(created.split("RECAPS ", 1)[1].splitlines()[0])
        (tmp_path / "recaps.json").write_text(json.dumps(recaps))
        with (
            replica_of(primary) as replica,
            pgbouncer(primary.port, pool_size=12) as bouncer,
            pgbouncer(replica.port, pool_size=4) as replica_bouncer,
        ):
            run_topology(tmp_path, direct, replica, bouncer, replica_bouncer, redis, recaps)


def run_topology(tmp_path, direct, replica, bouncer, replica_bouncer, redis, recaps):
    web_ports = [free_port(), free_port()]
    renderer_port = free_port()
    env = app_env(
        bouncer.url("eventdrop"),
        DATABASE_POOLER="pgbouncer",
        DATABASE_REPLICA_URL=replica_bouncer.url("eventdrop"),
        Q_BROKER="redis",
        REDIS_URL=redis.url,
        Q_WORKERS="1",
        WEB_CONCURRENCY="1",
        METRICS_BEARER_TOKEN=METRICS_TOKEN,
        RENDER_SERVICE_URL=f"http://127.0.0.1:{renderer_port}",
        RENDER_CALLBACK_URL=f"http://127.0.0.1:{web_ports[1]}/webhooks/renderer/",
        # Work a killed process held comes back within seconds, not the production minutes.
        DELIVERY_STALE_AFTER_SECONDS="10",
        OUTBOX_STALE_PROCESSING_SECONDS="25",
        OUTBOX_DISPATCH_BUDGET_SECONDS="20",
        OUTBOX_IDLE_SLEEP_SECONDS="0.5",
        OUTBOX_BACKOFF_BASE_SECONDS="1",
        OUTBOX_BACKOFF_CAP_SECONDS="2",
        RENDER_EXPECTED_SECONDS="3",
        RENDER_CALLBACK_MARGIN_SECONDS="3",
        RENDER_CHECK_INTERVAL_SECONDS="4",
        DELIVERY_BACKOFF_BASE_SECONDS="1",
        DELIVERY_BACKOFF_CAP_SECONDS="2",
        INBOX_ROW_RETRY_BASE_SECONDS="1",
    )
    manage("database_timeouts", env=env)
    bouncer.admin("RECONNECT")
    manage("ensure_schedules", env=env)

    fleet = Fleet(tmp_path)
    try:
        fleet.start(
            "renderer",
            lambda log: start_manage(
                ["run_fake_renderer", "--port", str(renderer_port), "--complete-after", "0.5"],
                env,
                log=log,
            ),
        )
        for n, port in enumerate(web_ports, 1):
            fleet.start(
                f"web{n}", lambda log, port=port: start_procfile("web", env, port=port, log=log)
            )
        for n in (1, 2):
            fleet.start(f"inbox{n}", lambda log: start_procfile("inbox", env, log=log))
            fleet.start(
                f"dispatcher{n}", lambda log: start_manage(["dispatch_side_effects"], env, log=log)
            )
            fleet.start(f"worker{n}", lambda log: start_procfile("worker", env, log=log))
        for n, port in enumerate(web_ports, 1):
            fleet.processes[f"web{n}"].wait_listening(port, timeout=60)
        fleet.processes["renderer"].wait_listening(renderer_port, timeout=30)

        replica_reads_before = replica_commits(replica)
        burst_deadline = time.monotonic() + BURST_SECONDS
        burst = fleet.start(
            "burst",
            lambda log: Managed(
                [
                    sys.executable,
                    str(BURST),
                    "--ports",
                    ",".join(map(str, web_ports)),
                    "--events",
                    str(EVENTS),
                    "--recaps",
                    str(tmp_path / "recaps.json"),
                    "--out",
                    str(tmp_path / "burst.json"),
                    "--concurrency",
                    "8",
                    "--rate",
                    str(BURST_RATE),
                    "--deadline",
                    str(BURST_SECONDS),
                ],
                env,
                log=log,
            ),
        )
        # One of each kind killed mid-burst and restarted at once (its replacement starts
        # while the others carry the load). Fewer rows than the burst's events means the
        # burst is still sending, so every kill lands during it.
        metrics_answers = []
        kills = []
        for k, name in enumerate(KILLED, 1):
            progress = wait_stored(direct, k * EVENTS // (len(KILLED) + 1), burst, burst_deadline)
            fleet.kill_and_restart(name)
            kills.append((name, progress))
            metrics_answers.append(scrape_metrics(web_ports[1]))
        fleet.processes["web1"].wait_listening(web_ports[0], timeout=60)
        try:
            burst.process.wait(timeout=max(1.0, burst_deadline - time.monotonic()) + 30)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the burst had not exited 30 s past its own {BURST_SECONDS} s "
                f"deadline; {progress_of(direct)}; kills: {kills}"
            )
        summary = json.loads((tmp_path / "burst.json").read_text())
        assert summary["failed"] == [], summary["failed"][:10]
        assert sum(summary["acked"].values()) == EVENTS + len(recaps), summary

        wait_drained(direct, fleet)
        assert fleet.dead() == [], fleet.dead()
        renders = json.load(
            urllib.request.urlopen(f"http://127.0.0.1:{renderer_port}/_stats", timeout=5)
        )
    finally:
        fleet.stop_all()

    # Every logical event stored once and verified; retried copies are duplicates of it.
    statuses = dict(
        query(direct, "SELECT signature_status, count(*) FROM ingress_rawevent GROUP BY 1")
    )
    assert set(statuses) == {"verified"}, statuses
    originals = scalar(
        direct, "SELECT count(*) FROM ingress_rawevent WHERE dispatch_status <> 'duplicate'"
    )
    # The burst's events, and one renderer callback per recap.
    assert originals == EVENTS + 2 * len(recaps), (originals, summary)
    # One dedup key per original; a body-only signature (GitHub, HMAC) also claims its
    # signature's key (ingress/signature_replays.py), so that a replay under a new delivery
    # id is questioned.
    assert (
        scalar(direct, "SELECT count(*) FROM ingress_dedupkey WHERE key NOT LIKE 'sig:%'")
        == originals
    )
    # Handled once: one delivery per (event, handler), each done.
    deliveries = dict(query(direct, "SELECT status, count(*) FROM ingress_delivery GROUP BY 1"))
    assert deliveries == {"done": 2 * len(recaps)}, deliveries
    assert (
        scalar(
            direct,
            "SELECT count(*) FROM (SELECT raw_event_id, handler FROM "
            "ingress_delivery GROUP BY 1, 2 HAVING count(*) > 1) d",
        )
        == 0
    )
    # Every paid recap rendered once.
    assert dict(query(direct, "SELECT status, count(*) FROM recap_videos GROUP BY 1")) == {
        "ready": len(recaps)
    }
    assert dict(query(direct, "SELECT status, count(*) FROM recap_side_effects GROUP BY 1")) == {
        "done": len(recaps)
    }
    assert renders["renders"] == len(recaps), renders
    # Reads through the replica while the burst ran.
    assert metrics_answers == [200] * 4
    assert replica_commits(replica) > replica_reads_before
    print(f"topology: {summary}; kills at {kills}")


def scrape_metrics(port: int) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status
    except OSError as exc:
        return getattr(exc, "code", 0)


def replica_commits(replica) -> int:
    return int(replica.psql("SELECT xact_commit FROM pg_stat_database WHERE datname = 'eventdrop'"))


def progress_of(direct: str) -> dict[str, int]:
    """How far the burst has come: rows stored and events the inbox has verified."""
    stored, verified = query(
        direct,
        """
        SELECT count(*), count(*) FILTER (WHERE signature_status = 'verified')
        FROM ingress_rawevent
    """,
    )[0]
    return {"stored": stored, "verified": verified}


def wait_stored(direct: str, rows: int, burst: Managed, deadline: float) -> dict[str, int]:
    """Wait until the raw-event table holds `rows` rows while the burst runs; the progress
    then. Fails, saying what it saw, if the burst ends first or the deadline passes."""
    while True:
        progress = progress_of(direct)
        if progress["stored"] >= rows:
            return progress
        if not burst.alive:
            pytest.fail(
                f"the burst exited ({burst.process.returncode}) with {progress} before "
                f"{rows} rows were stored: {burst.output()[-1500:]}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"waited {BURST_SECONDS} s for {rows} rows stored; saw {progress}")
        time.sleep(0.2)


def wait_drained(direct: str, fleet: Fleet) -> None:
    deadline = time.monotonic() + DRAIN_SECONDS
    while True:
        waiting = dict(
            query(
                direct,
                """
            SELECT 'raw events pending', count(*) FROM ingress_rawevent
                WHERE signature_status = 'pending'
            UNION ALL SELECT 'deliveries pending or processing', count(*) FROM ingress_delivery
                WHERE status IN ('pending', 'processing')
            UNION ALL SELECT 'side effects pending or processing', count(*)
                FROM recap_side_effects WHERE status IN ('pending', 'processing')
            UNION ALL SELECT 'recaps not ready', count(*) FROM recap_videos
                WHERE status <> 'ready'
        """,
            )
        )
        if not any(waiting.values()):
            return
        if time.monotonic() > deadline:
            logs = {name: p.output()[-1500:] for name, p in fleet.processes.items()}
            pytest.fail(f"still waiting after {DRAIN_SECONDS} s: {waiting}; logs: {logs}")
        time.sleep(1)
