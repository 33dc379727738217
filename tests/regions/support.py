"""What the real-process region tests share (tests/regions/test_multi_region.py,
test_rejoin.py): two throw-away PostgreSQL 15 clusters with `wal_level = logical`, each
migrated as its own region and set up both ways; queries against either; signed Stripe
events; the cluster's SIGKILL; the operator's decisions."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import requests

from tests.support.pg_cluster import Cluster, throwaway_cluster
from tests.support.processes import TEST_SECRETS, app_env, manage, migrate
from tests.support.signing import stripe_event

BOTH_EVERY = 10  # every tenth event goes to both regions
EVENT_TYPE = "payment_intent.succeeded"  # bench/handlers.py's handler


def logical(cluster: Cluster) -> None:
    with (cluster.config_dir / "postgresql.conf").open("a") as conf:
        conf.write("wal_level = logical\n")
    cluster.restart()


def query(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(url, connect_timeout=10) as conn:
        return conn.execute(sql, params).fetchall()


def scalar(url: str, sql: str, params: tuple = ()):
    return query(url, sql, params)[0][0]


def execute(url: str, sql: str, params: tuple = ()) -> None:
    with psycopg.connect(url, connect_timeout=10, autocommit=True) as conn:
        conn.execute(sql, params)


def region_env(
    name: str, number: int, url: str, peer: str, peer_url: str, **extra: str
) -> dict[str, str]:
    return app_env(
        url,
        DJANGO_SETTINGS_MODULE="bench.settings_inbox",
        EVENTDROP_REGION=name,
        EVENTDROP_REGION_NUMBER=str(number),
        EVENTDROP_REGION_PEERS=f"{peer}={peer_url}",
        EVENTDROP_REGION_LEASE_SECONDS="10",
        EVENTDROP_REGION_PEER_FRESH_SECONDS="10",
        WEB_CONCURRENCY="1",
        INBOX_IDLE_SLEEP_SECONDS="0.2",
        **extra,
    )


def region_setup(env: dict[str, str], *args: str) -> str:
    return manage("region_setup", *args, env=env).stdout


@dataclass
class TwoRegions:
    clusters: dict[str, Cluster]
    urls: dict[str, str]
    envs: dict[str, dict[str, str]]


@contextlib.contextmanager
def two_databases(**extra: str) -> Iterator[TwoRegions]:
    """eu (number 1) and us (number 2): two throw-away clusters with logical replication on,
    each migrated, not set up; `extra` goes into both regions' environments."""
    with throwaway_cluster(prefix="edeu") as eu_db, throwaway_cluster(prefix="edus") as us_db:
        for cluster in (eu_db, us_db):
            logical(cluster)
        urls = {"eu": eu_db.createdb("eventdrop"), "us": us_db.createdb("eventdrop")}
        envs = {
            "eu": region_env("eu", 1, urls["eu"], "us", urls["us"], **extra),
            "us": region_env("us", 2, urls["us"], "eu", urls["eu"], **extra),
        }
        for env in envs.values():
            migrate(env)
        yield TwoRegions({"eu": eu_db, "us": us_db}, urls, envs)


def set_up_both(envs: dict[str, dict[str, str]]) -> None:
    """region_setup in both, eu the first processing region: eu's first run cannot subscribe
    yet (us has no publications), its second does."""
    with contextlib.suppress(RuntimeError):
        region_setup(envs["eu"], "--processing-region", "eu")
    region_setup(envs["us"])
    region_setup(envs["eu"])


@contextlib.contextmanager
def two_regions(**extra: str) -> Iterator[TwoRegions]:
    """eu (number 1, the first processing region) and us (number 2), migrated and set up
    both ways; `extra` goes into both regions' environments."""
    with two_databases(**extra) as regions:
        set_up_both(regions.envs)
        yield regions


def signed_post(port: int, body: bytes) -> int:
    """POST a Stripe event body, signed as Stripe signs, to a region's web server."""
    timestamp = int(time.time())
    secret = TEST_SECRETS["STRIPE_WEBHOOK_SECRET"].encode()
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    answer = requests.post(
        f"http://127.0.0.1:{port}/webhooks/stripe/",
        data=body,
        headers={
            "Stripe-Signature": f"t={timestamp},v1={digest}",
            "Content-Type": "application/json",
        },
        timeout=(2, 15),
    )
    return answer.status_code


def post(port: int, event_id: str) -> int:
    return signed_post(port, stripe_event(event_id, EVENT_TYPE, {"id": f"pi_{event_id}"}))


def settled_summary(url: str) -> dict:
    return dict(
        query(
            url,
            "SELECT signature_status || '/' || dispatch_status, count(*) FROM ingress_rawevent "
            "GROUP BY 1",
        )
    )


def event_id(dedup_key: str) -> str:
    """The provider's event id in a dedup key (which may carry a prefix)."""
    return dedup_key.rsplit(":", 1)[-1]


def kill_cluster(cluster: Cluster) -> None:
    """SIGKILL every process of the cluster: the region's database melts."""
    for pid in cluster.pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def decide(env: dict[str, str], region: str, *, peer_lost: bool = False, reason: str) -> None:
    """The operator's decision, made in the region whose environment this is."""
    manage(
        "shell",
        "-c",
        "from regions.services import processing_region_set; "
        f"processing_region_set(region={region!r}, peer_lost={peer_lost!r}, reason={reason!r})",
        env=env,
    )


def take_over(env: dict[str, str], region: str, timeout: float = 60) -> None:
    """The takeover, retried while the lost region's lease (as replicated) still runs."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            decide(env, region, peer_lost=True, reason="the other region melted")
            return
        except RuntimeError as refused:
            assert "holds the processing lease" in str(refused), refused
            assert time.monotonic() < deadline, "the lost region's lease never ran out"
            time.sleep(0.5)


def lease_epoch(url: str, region: str) -> int | None:
    """The epoch under which `region` last took the processing lease, as `url` sees it."""
    return scalar(url, "SELECT lease_epoch FROM regions_regionstate WHERE name = %s", (region,))


def handler_runs(url: str) -> Counter:
    """Handler runs per provider event (bench/handlers.py writes one row per run)."""
    return Counter(
        event_id(key)
        for (key,) in query(
            url,
            "SELECT r.dedup_key FROM bench_handlerrun h JOIN ingress_rawevent r "
            "ON r.id = h.raw_event_id",
        )
    )
