"""A store that does not answer: every webhook is still answered within its provider's timeout.

Real processes on a throw-away PostgreSQL cluster (tests/support/pg_cluster.py; the lock
cannot stall anybody else's tests): the Procfile's `web` line at its production defaults,
and 400 signed GitHub webhooks sent at once from a separate process (tests/faults/load.py),
each on a connection of its own, while a transaction holds `LOCK TABLE ingress_rawevent IN
ACCESS EXCLUSIVE MODE`. The lock is held for 30 s and until every sender has its answer (so
no answer can come from the lock's release).

Invariants: every request is answered within GitHub's 10 s (the source's budget, its
provider's timeout: ingress/providers.py), before the lock is released; each answer is a
2xx whose row holds exactly the bytes sent, or a 503 with Retry-After and a JSON error. Once
the lock is released, webhooks are stored again. About 50 s on 2 cores.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/eventdrop \\
        .venv/bin/python -m pytest tests/faults/test_locked_store.py -q -p no:cacheprovider
"""

import base64
import json
import os
import time
from pathlib import Path

import psycopg
import pytest

from tests.support.pg_cluster import throwaway_cluster
from tests.support.processes import PYTHON, Managed, app_env, free_port, migrate, start_procfile

pytestmark = pytest.mark.faults

LOAD_SCRIPT = Path(__file__).with_name("load.py")
SENDERS = 400
LOCK_SECONDS = 30.0
GITHUB_TIMEOUT_SECONDS = 10.0
# Bounds a run that went wrong, never the expected one.
LOAD_WAIT_SECONDS = 120.0


@pytest.fixture
def stack(tmp_path):
    with throwaway_cluster(prefix="edlock") as cluster:
        database_url = cluster.createdb("eventdrop")
        env = app_env(database_url, WEB_BIND="127.0.0.1")
        migrate(env)
        port = free_port()
        web = start_procfile("web", env, port=port, log=tmp_path / "web.log")
        try:
            web.wait_listening(port, timeout=30)
            yield database_url, port, web
        finally:
            web.stop()


def send(port: int, out: Path, log: Path, requests: int, concurrency: int) -> list[dict]:
    """`requests` webhooks from `concurrency` connections at once; their answers."""
    load = Managed(
        [
            PYTHON,
            str(LOAD_SCRIPT),
            "--port",
            str(port),
            "--out",
            str(out),
            "--requests",
            str(requests),
            "--concurrency",
            str(concurrency),
            "--duration",
            str(LOAD_WAIT_SECONDS),
            "--pause",
            "0",
            "--timeout",
            "60",
        ],
        env=dict(os.environ),
        log=log,
    )
    load.process.wait(timeout=LOAD_WAIT_SECONDS + 30)
    assert load.stop() == 0, load.output()
    return [json.loads(line) for line in out.read_text().splitlines()]


def rows(database_url: str) -> dict[int, bytes]:
    with psycopg.connect(database_url, connect_timeout=10) as conn:
        stored = conn.execute("SELECT id, body FROM ingress_rawevent")
        return {pk: bytes(body) for pk, body in stored}


def test_a_locked_table_is_answered_within_githubs_timeout(stack, tmp_path):
    database_url, port, web = stack
    with psycopg.connect(database_url, connect_timeout=10) as lock:
        lock.execute("LOCK TABLE ingress_rawevent IN ACCESS EXCLUSIVE MODE")
        locked_at = time.monotonic()
        results = send(port, tmp_path / "locked.jsonl", tmp_path / "locked.log", SENDERS, SENDERS)
        time.sleep(max(0.0, locked_at + LOCK_SECONDS - time.monotonic()))
        lock.rollback()
    released_at = time.time()

    stored = rows(database_url)
    assert len(results) == SENDERS
    seconds = sorted(r["seconds"] for r in results)
    statuses: dict[str, int] = {}
    for r in results:
        code = json.loads(r["response"]).get("error", "") if r["status"] else r["error"]
        statuses[f"{r['status']} {code}"] = statuses.get(f"{r['status']} {code}", 0) + 1
    print(
        f"{SENDERS} webhooks against a locked table: {statuses}; answer seconds min "
        f"{seconds[0]:.2f}, median {seconds[len(seconds) // 2]:.2f}, p99 "
        f"{seconds[int(len(seconds) * 0.99) - 1]:.2f}, max {seconds[-1]:.2f}"
    )
    problems = []
    for r in results:
        where = f"request {r['n']} ({r['seconds']:.2f} s, status {r['status']})"
        if r["seconds"] > GITHUB_TIMEOUT_SECONDS:
            problems.append(f"{where}: answered after GitHub's {GITHUB_TIMEOUT_SECONDS:g} s")
        if r["started"] + r["seconds"] > released_at:
            problems.append(f"{where}: answered after the lock's release")
        if r["status"] is None:
            problems.append(f"{where}: no answer: {r['error']}")
        elif 200 <= r["status"] < 300:
            if stored.get(json.loads(r["response"]).get("id")) != base64.b64decode(r["body_b64"]):
                problems.append(f"{where}: a 2xx without its row")
        elif r["status"] != 503 or not r["retry_after"]:
            problems.append(f"{where}: neither a 2xx nor a 503 with Retry-After: {r['response']}")
        elif json.loads(r["response"]).get("error") is None:
            problems.append(f"{where}: a 503 without a JSON error")
    assert not problems, f"{len(problems)} problems, first: {problems[:10]}"

    # Released: stored again, on the same server.
    after = send(port, tmp_path / "after.jsonl", tmp_path / "after.log", 8, 4)
    assert [r["status"] for r in after] == [202] * 8, after
    stored = rows(database_url)
    for r in after:
        assert stored[json.loads(r["response"])["id"]] == base64.b64decode(r["body_b64"])
    assert web.alive
