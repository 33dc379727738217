"""A web worker that dies is replaced, and webhooks go on being stored.

The Procfile's web server on the test database with two worker processes. One is killed with
SIGKILL (a segfault, the OOM killer: nothing of it runs after); within seconds the server's
supervisor has started another, and every webhook sent afterwards, each on a new connection
(the kernel spreads them over both workers' shared socket), is answered 202 and stored with
exactly the bytes sent. About 10 s.
"""

import http.client
import json
import os
import signal
import subprocess
import time

import pytest
from django.db import connection

from ingress.models import RawEvent
from tests.support.processes import app_env, free_port, start_procfile

pytestmark = pytest.mark.faults

RESPAWN_SECONDS = 20


def _database_url() -> str:
    db = connection.settings_dict
    credentials = f"{db['USER']}:{db['PASSWORD']}" if db.get("PASSWORD") else db["USER"]
    return f"postgres://{credentials}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def _workers(supervisor: int) -> set[int]:
    """The supervisor's worker processes: its children (the server forks them)."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(supervisor)],
        capture_output=True,
        text=True,
        check=False,
    )
    return {int(pid) for pid in out.stdout.split()}


def _post(port: int, body: bytes) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(
            "POST",
            "/webhooks/stripe/",
            body=body,
            headers={
                "Content-Type": "application/json",
                "Stripe-Signature": "t=1700000000,v1=00",
            },
        )
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_is_replaced_and_webhooks_are_still_stored(tmp_path):
    port = free_port()
    env = app_env(_database_url(), WEB_CONCURRENCY="2")
    web = start_procfile("web", env, port=port, log=tmp_path / "web.log")
    try:
        web.wait_listening(port, timeout=30)
        assert _post(port, b'{"id": "evt_before"}')[0] == 202
        before = _workers(web.pid)
        assert len(before) == 2, (before, web.output()[-2000:])

        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + RESPAWN_SECONDS
        now = _workers(web.pid)
        while (len(now) != 2 or victim in now) and time.monotonic() < deadline:
            time.sleep(0.2)
            now = _workers(web.pid)
        assert len(now) == 2 and victim not in now, (now, web.output()[-2000:])
        # The replacement may be forked before the port accepts again: a refused connection
        # acknowledged nothing (the sender retries); what follows must all be stored.
        web.wait_listening(port, timeout=30)

        bodies = [b'{"id": "evt_after_%d"}' % n for n in range(20)]
        answers = [_post(port, body) for body in bodies]
    finally:
        web.stop()

    assert [status for status, _ in answers] == [202] * 20, answers
    stored = {answer["id"]: body for (_, answer), body in zip(answers, bodies, strict=True)}
    assert {
        event.pk: bytes(event.body) for event in RawEvent.objects.filter(pk__in=stored)
    } == stored
