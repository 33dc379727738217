"""Every process through a real PgBouncer in transaction pooling mode (issue 14, part 1).

A throw-away cluster (tests/support/pg_cluster.py), migrated directly (the release phase),
and Debian's PgBouncer in front of it on a free port with a pool of 2 server connections,
so that every client's transactions really are spread over shared server sessions. Then:

- the settings as they were (statement_timeout as the libpq `options` startup setting) do
  not even connect through PgBouncer;
- with DATABASE_POOLER=pgbouncer, a connection is refused until the database's default
  statement_timeout is set (`manage.py database_timeouts`), and refused when it is longer
  than the settings ask for; once set, the server cancels a statement at that cap;
- the Procfile's web server and the inbox worker run through PgBouncer: signed webhooks of
  three sources are accepted, verified, deduplicated and delivered, and partition maintenance
  (transaction-scoped advisory lock) runs through it;
- the client-side bound survives PgBouncer: with PostgreSQL frozen behind it, a webhook is a
  503 within the store deadline (PgBouncer queues the query; only our bound ends the wait).

About 25 s on 2 cores (the cluster, two web server starts and a 6 s freeze).
"""

import hashlib
import hmac
import http.client
import json
import time
import uuid

import psycopg
import pytest

from tests.faults.servers import pgbouncer
from tests.support.pg_cluster import throwaway_cluster
from tests.support.processes import (
    TEST_SECRETS,
    app_env,
    free_port,
    manage,
    migrate,
    start_procfile,
)
from tests.support.signing import stripe_event
from tests.support.sql import scalar

pytestmark = pytest.mark.faults

STORE_DEADLINE_SECONDS = 2.5
ANSWER_MARGIN_SECONDS = 1.5


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with throwaway_cluster(prefix="edbouncer") as cluster:
        direct = cluster.createdb("eventdrop")
        migrate(app_env(direct))
        with pgbouncer(cluster.port, pool_size=2) as bouncer:
            yield cluster, direct, bouncer, tmp_path_factory.mktemp("pgbouncer")


def pooled_env(bouncer, **extra):
    return app_env(bouncer.url("eventdrop"), DATABASE_POOLER="pgbouncer", **extra)


def probe(env) -> str:
    """One Django connection and query in a process with this environment."""
    code = (
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute('SHOW statement_timeout'); print(c.fetchone()[0])\n"
    )
    return manage("shell", "-c", code, env=env, timeout=60).stdout.strip().splitlines()[-1]


def set_database_default(bouncer, ms: int) -> None:
    manage("database_timeouts", env=pooled_env(bouncer, DATABASE_STATEMENT_TIMEOUT_MS=str(ms)))
    # A database default applies to server sessions started after it: PgBouncer renews its
    # pool (as after server_lifetime), as the release phase's docs say to.
    bouncer.admin("RECONNECT")


def test_the_startup_option_does_not_pass_pgbouncer(stack):
    """What the settings did before: PgBouncer refuses the connection outright."""
    _, _, bouncer, _ = stack
    with pytest.raises(RuntimeError, match="unsupported startup parameter: options"):
        probe(app_env(bouncer.url("eventdrop")))


def test_a_connection_is_refused_until_the_database_default_caps_statements(stack):
    cluster, _, bouncer, _ = stack
    cluster.psql("ALTER DATABASE eventdrop RESET statement_timeout")
    with pytest.raises(RuntimeError, match="statement_timeout on the server is 0 ms"):
        probe(pooled_env(bouncer))
    set_database_default(bouncer, 1000)
    # A server cap longer than the settings' is refused too; a shorter one is accepted.
    with pytest.raises(RuntimeError, match=r"server is 1000 ms .* ask for 500 ms"):
        probe(pooled_env(bouncer, DATABASE_STATEMENT_TIMEOUT_MS="500"))
    assert probe(pooled_env(bouncer, DATABASE_STATEMENT_TIMEOUT_MS="5000")) == "1s"
    # The server itself enforces it on every pooled connection.
    with psycopg.connect(bouncer.url("eventdrop"), connect_timeout=5) as conn:
        started = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT pg_sleep(5)")
        assert time.monotonic() - started < 3
    set_database_default(bouncer, 15000)
    assert probe(pooled_env(bouncer)) == "15s"


def slack_request(n: int) -> tuple[str, bytes, dict[str, str]]:
    body = json.dumps(
        {"type": "event_callback", "event_id": f"Ev{n:08d}", "event": {"type": "message"}}
    ).encode()
    timestamp = str(int(time.time()))
    digest = hmac.new(
        TEST_SECRETS["SLACK_SIGNING_SECRET"].encode(),
        f"v0:{timestamp}:".encode() + body,
        hashlib.sha256,
    ).hexdigest()
    return (
        "slack",
        body,
        {
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": f"v0={digest}",
        },
    )


def github_request(n: int) -> tuple[str, bytes, dict[str, str]]:
    body = json.dumps({"zen": "pooled", "n": n}).encode()
    digest = hmac.new(
        TEST_SECRETS["GITHUB_WEBHOOK_SECRET"].encode(), body, hashlib.sha256
    ).hexdigest()
    return (
        "github",
        body,
        {
            "X-Hub-Signature-256": f"sha256={digest}",
            "X-GitHub-Event": "ping",
            "X-GitHub-Delivery": str(uuid.uuid4()),
        },
    )


def stripe_request(n: int) -> tuple[str, bytes, dict[str, str]]:
    import stripe

    body = stripe_event(f"evt_pooled_{n}", "customer.created")
    timestamp = int(time.time())
    signature = stripe.WebhookSignature._compute_signature(
        f"{timestamp}.{body.decode()}", TEST_SECRETS["STRIPE_WEBHOOK_SECRET"]
    )
    return "stripe", body, {"Stripe-Signature": f"t={timestamp},v1={signature}"}


def post(port: int, source: str, body: bytes, headers: dict[str, str], timeout: float = 10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST",
            f"/webhooks/{source}/",
            body=body,
            headers={"Content-Type": "application/json", **headers},
        )
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_webhooks_and_the_inbox_run_through_pgbouncer(stack):
    _, direct, bouncer, workdir = stack
    set_database_default(bouncer, 15000)
    log_start = len(bouncer.output())
    env = pooled_env(bouncer, WEB_CONCURRENCY="2")
    port = free_port()
    requests = [
        make(n) for n in range(30) for make in (github_request, stripe_request, slack_request)
    ]
    # The same Stripe event twice: one event after dedup.
    requests.append(stripe_request(0))
    with start_procfile("web", env, port=port, log=workdir / "web.log") as web:
        web.wait_listening(port, timeout=30)
        answers = [post(port, *request) for request in requests]
    assert [status for status, _ in answers] == [202] * len(requests), answers[:3]

    manage("process_inbox", "--once", env=env, timeout=120)
    manage("raw_event_partitions", env=env, timeout=120)

    with psycopg.connect(direct, connect_timeout=10) as conn:
        statuses: dict[str, int] = dict(
            conn.execute(
                "SELECT signature_status, count(*) FROM ingress_rawevent GROUP BY 1"
            ).fetchall()
        )
        duplicates = scalar(
            conn, "SELECT count(*) FROM ingress_rawevent WHERE duplicate_of_id IS NOT NULL"
        )
        unfinished = scalar(
            conn, "SELECT count(*) FROM ingress_delivery WHERE status NOT IN ('done', 'dead')"
        )
    assert statuses == {"verified": len(requests)}, statuses
    assert duplicates == 1
    assert unfinished == 0
    assert "unsupported startup parameter" not in bouncer.output()[log_start:]


def test_a_frozen_server_behind_pgbouncer_is_a_503_within_the_store_deadline(stack):
    cluster, _, bouncer, workdir = stack
    set_database_default(bouncer, 15000)
    env = pooled_env(bouncer, WEBHOOK_STORE_TIMEOUT_SECONDS=str(STORE_DEADLINE_SECONDS))
    port = free_port()
    with start_procfile("web", env, port=port, log=workdir / "web-frozen.log") as web:
        web.wait_listening(port, timeout=30)
        assert post(port, *github_request(1000))[0] == 202  # connections are open
        cluster.freeze()
        try:
            started = time.monotonic()
            status, body = post(port, *github_request(1001))
            took = time.monotonic() - started
        finally:
            cluster.thaw()
        assert status == 503, body
        assert json.loads(body)["error"] == "store_unavailable"
        assert took < STORE_DEADLINE_SECONDS + ANSWER_MARGIN_SECONDS
        # And it recovers through the same PgBouncer.
        deadline = time.monotonic() + 15
        while post(port, *github_request(1002))[0] != 202:
            assert time.monotonic() < deadline, "no 202 within 15 s of the thaw"
            time.sleep(0.2)
