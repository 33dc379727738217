"""Read-only screens from a real streaming replica, everything else on the primary (part 3).

A throw-away primary and a hot standby of it (`replica_of`, pg_basebackup -R). To see who
answers, the replica is made to differ: its replay is paused, then events arrive on the
primary only. Each request runs the whole middleware stack (kernel/routers.py) in a
separate process configured with DATABASE_URL and DATABASE_REPLICA_URL:

- the API's list and the ops page are served by the replica (they do not see the new
  events) while it is within DATABASE_REPLICA_MAX_LAG_SECONDS;
- an operator action (a POST) works on the primary, and the browser's next page reads the
  primary (it sees the new events and the action's result);
- the inbox's claims run on the primary: it verifies the events the replica does not have;
- with a tighter lag limit, or with the replica stopped, the same pages are served by the
  primary, and the ops page says why;
- /metrics says the same (eventdrop_replica_up, _lag_seconds, _serving_reads), in each case.

About 25 s on 2 cores (two clusters, a base backup, a handful of processes).
"""

import json
import time

import psycopg
import pytest

from tests.support.pg_cluster import replica_of, throwaway_cluster
from tests.support.processes import app_env, manage, migrate
from tests.support.sql import scalar

pytestmark = pytest.mark.faults

# Runs inside `manage.py shell`: Django's test client through every middleware and router.
PAGES = """
import json, re
from django.contrib.auth import get_user_model
from django.test import Client
user, _ = get_user_model().objects.get_or_create(
    username="oncall", defaults={"is_staff": True, "is_superuser": True})
client = Client()
client.force_login(user)
def seen():
    listed = len(client.get("/api/raw-events/?limit=100").json()["results"])
    page = client.get("/ops/").content.decode()
    match = re.search(
        r'id="ops-replica" data-serving="(\\w+)">Read from: <span[^>]*>([^<]*)<', page)
    scraped = client.get("/metrics").content.decode().splitlines()
    replica = {line.split()[0]: float(line.split()[1])
               for line in scraped if line.startswith("eventdrop_replica_")}
    return {"listed": listed, "serving": match and match.group(1), "line": match and match.group(2),
            "metrics": replica}
result = {"before": seen()}
if ACTION:
    response = client.post("/api/raw-events/replay/", {"ids": [NEWEST]},
                           content_type="application/json")
    result["action"] = response.status_code
    result["after"] = seen()
print("RESULT " + json.dumps(result))
"""


def pages(env, *, action: bool = False, newest: int = 0) -> dict:
    code = PAGES.replace("ACTION", str(action)).replace("NEWEST", str(newest))
    output = manage("shell", "-c", code, env=env, timeout=60).stdout
    line = next(line for line in output.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def store_events(env, first: int, count: int) -> None:
    code = (
        "from tests.support.signing import store_signed_stripe_event, stripe_event\n"
        f"for n in range({first}, {first + count}):\n"
        "    store_signed_stripe_event(stripe_event(f'evt_replica_{n}', 'customer.created'))\n"
    )
    manage("shell", "-c", code, env=env, timeout=60)


def wait_replayed(primary, replica, timeout: float = 20) -> None:
    target = primary.psql("SELECT pg_current_wal_lsn()", db="eventdrop")
    deadline = time.monotonic() + timeout
    while (
        replica.psql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn", db="eventdrop")
        != "t"
    ):
        replayed = replica.psql("SELECT pg_last_wal_replay_lsn()", db="eventdrop")
        assert time.monotonic() < deadline, (
            f"waited {timeout} s for the replica to replay up to {target}; it is at {replayed}"
        )
        time.sleep(0.2)


def test_reads_from_the_replica_writes_and_claims_on_the_primary_with_fallback():
    with throwaway_cluster(prefix="edprimary") as primary:
        url = primary.createdb("eventdrop")
        migrate(app_env(url))
        store_events(app_env(url), 0, 3)
        with replica_of(primary) as replica:
            replica_url = replica.url("eventdrop")

            def env(max_lag: float = 3600):
                return app_env(
                    url,
                    DATABASE_REPLICA_URL=replica_url,
                    DATABASE_REPLICA_MAX_LAG_SECONDS=str(max_lag),
                    ALLOWED_HOSTS="testserver",
                )

            pages(env())  # creates the user and its session on the primary
            wait_replayed(primary, replica)
            replica.psql("SELECT pg_wal_replay_pause()", db="eventdrop")
            store_events(env(), 100, 4)  # on the primary only
            with psycopg.connect(url) as conn:
                newest = scalar(conn, "SELECT max(id) FROM ingress_rawevent")

            # Claims stay on the primary: the inbox verifies what the replica lacks.
            manage("process_inbox", "--once", env=env(), timeout=60)
            with psycopg.connect(url) as conn:
                verified = (
                    "SELECT count(*) FROM ingress_rawevent WHERE signature_status = 'verified'"
                )
                assert scalar(conn, verified) == 7

            seen = pages(env(), action=True, newest=newest)
            # Served by the replica: 3 events, not the 7 of the primary.
            assert seen["before"]["listed"] == 3, seen
            assert seen["before"]["serving"] == "replica", seen
            assert "s behind (limit 3600 s)" in seen["before"]["line"]
            # /metrics says the same as the page (and an alert can watch it).
            scraped = seen["before"]["metrics"]
            assert scraped["eventdrop_replica_up"] == 1, scraped
            assert scraped["eventdrop_replica_serving_reads"] == 1, scraped
            assert scraped["eventdrop_replica_max_lag_seconds"] == 3600, scraped
            assert scraped["eventdrop_replica_lag_seconds"] >= 0, scraped
            # The operator's action is written on the primary (the event is only there),
            # and the next page of that browser reads the primary.
            assert seen["action"] == 200, seen
            assert seen["after"]["listed"] == 7, seen
            with psycopg.connect(url) as conn:
                assert scalar(conn, "SELECT count(*) FROM console_operatoraction") == 1

            # Too far behind: a limit below the replica's lag sends reads to the primary.
            time.sleep(1.5)
            behind = pages(env(max_lag=1))["before"]
            assert behind["listed"] == 7, behind
            assert behind["serving"] == "primary"
            assert "behind (limit 1 s)" in behind["line"], behind
            assert behind["metrics"]["eventdrop_replica_serving_reads"] == 0, behind
            assert behind["metrics"]["eventdrop_replica_up"] == 1, behind
            assert behind["metrics"]["eventdrop_replica_lag_seconds"] > 1, behind

            # Unreachable: the same, and the page says so.
            replica.stop("immediate")
            gone = pages(env())["before"]
            assert gone["listed"] == 7, gone
            assert gone["serving"] == "primary"
            assert "unreachable" in gone["line"], gone
            assert gone["metrics"] == {
                "eventdrop_replica_up": 0,
                "eventdrop_replica_max_lag_seconds": 3600,
                "eventdrop_replica_serving_reads": 0,
            }, gone  # no lag: it cannot be measured
