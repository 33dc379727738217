"""Two regions on real processes (issue 32): two throw-away PostgreSQL 15 clusters with
`wal_level = logical`, each migrated as its own region, `region_setup` both ways, each with
its own web server (the Procfile's `web`) and inbox worker (`inbox`).

Signed Stripe events are split between the regions, every tenth sent to both (a provider
retry re-routed by the load balancer). Afterwards, in both regions' databases: every event
stored once per copy sent, with the region that received it; each provider event settled
once, the other copy `duplicate` of it; every event's handler run exactly once (in the
processing region, bench/handlers.py's row per run), and the deliveries and verdicts the
processing region wrote present in the other region too. The replication lag is measured
both ways. Then processing is moved to the other region (the operator's decision): the old
region stops before the new one starts, and what arrives afterwards is handled there, once.

Size: MULTI_REGION_EVENTS (default 1,000 in the suite; the issue's 20,000 is run by hand,
figures in docs/multi-region.md). Settings: bench/settings_inbox.py, whose app registers
the counting handler.
"""

import functools
import hashlib
import hmac
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import requests

from regions.replication import WITHOUT_STATE_SIGNATURE as TAKEOVER_SIGNATURE
from tests.regions.support import (
    BOTH_EVERY,
    EVENT_TYPE,
    event_id,
    execute,
    handler_runs,
    kill_cluster,
    lease_epoch,
    post,
    query,
    region_setup,
    scalar,
    set_up_both,
    settled_summary,
    two_databases,
    two_regions,
)
from tests.support.pg_cluster import Cluster
from tests.support.processes import (
    TEST_SECRETS,
    Managed,
    free_port,
    manage,
    start_procfile,
    wait_until,
)
from tests.support.signing import stripe_event

pytestmark = pytest.mark.faults

EVENTS = int(os.environ.get("MULTI_REGION_EVENTS", "1000"))
HANDLER = "count_bench_delivery_0"
DRAIN_SECONDS = 60 + EVENTS / 50


def send_all(ports: dict[str, int], names: list[str], prefix: str, count: int) -> dict:
    """Event n goes to one region (alternating), every BOTH_EVERY-th to both; returns what
    was sent where and every answer that was not 202."""
    plan = []
    for n in range(count):
        event_id = f"evt_{prefix}_{n}"
        targets = names if n % BOTH_EVERY == 0 else [names[n % 2]]
        plan += [(target, event_id) for target in targets]
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda item: (item, post(ports[item[0]], item[1])), plan))
    return {
        "copies": len(plan),
        "per_region": {name: sum(1 for target, _ in plan if target == name) for name in names},
        "not_202": [(item, status) for item, status in answers if status != 202],
    }


def replication_lag(urls: dict[str, str], ports: dict[str, int], source: str, target: str):
    """Seconds from a 202 in `source` until the row is visible in `target`."""
    event_id = f"evt_lag_{source}_{uuid.uuid4().hex[:8]}"
    assert post(ports[source], event_id) == 202
    acked = time.monotonic()
    # The body is bytea: its id is looked up in its hex encoding.
    hex_id = event_id.encode().hex()
    sql = "SELECT count(*) FROM ingress_rawevent WHERE encode(body, 'hex') LIKE %s"
    deadline = acked + 60
    while time.monotonic() < deadline:
        if scalar(urls[target], sql, (f"%{hex_id}%",)):
            return time.monotonic() - acked
        time.sleep(0.02)
    raise AssertionError(f"{event_id} from {source} never reached {target}")


def test_two_regions_store_everything_see_everything_and_handle_each_event_once(tmp_path: Path):
    with two_databases() as regions:
        run_two_regions(tmp_path, regions.urls, regions.envs)


def run_two_regions(tmp_path: Path, urls: dict[str, str], envs: dict[str, dict]) -> None:
    # The first region set up cannot subscribe yet: its peer has no publications. It says so
    # and exits non-zero; once the peer is set up, running it again completes. Then both
    # again: nothing left to do.
    with pytest.raises(RuntimeError, match="run region_setup there"):
        region_setup(envs["eu"], "--processing-region", "eu")
    region_setup(envs["us"])
    region_setup(envs["eu"])
    again = region_setup(envs["us"]) + region_setup(envs["eu"])
    assert "created" not in again and "now takes" not in again, again
    assert scalar(urls["us"], "SELECT count(*) FROM pg_subscription") == 1
    # Both SECURITY DEFINER functions exist, and PUBLIC may not run them (db_roles grants).
    for url in urls.values():
        for signature in ("eventdrop_region_publish_state(boolean)", TAKEOVER_SIGNATURE):
            public_may = scalar(
                url,
                "SELECT bool_or(a.grantee = 0) FROM pg_proc p, "
                "aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a "
                "WHERE p.oid = %s::regprocedure",
                (signature,),
            )
            assert public_may is False, signature

    ports = {"eu": free_port(), "us": free_port()}
    processes: list[Managed] = []
    try:
        for name in ("eu", "us"):
            processes.append(
                start_procfile(
                    "web", envs[name], port=ports[name], log=tmp_path / f"web-{name}.log"
                )
            )
            processes.append(
                start_procfile("inbox", envs[name], log=tmp_path / f"inbox-{name}.log")
            )
        for process, port in zip(processes[::2], ports.values(), strict=True):
            process.wait_listening(port, timeout=60)

        started = time.monotonic()
        sent = send_all(ports, ["eu", "us"], "mr", EVENTS)
        send_seconds = time.monotonic() - started
        assert sent["not_202"] == []
        copies = sent["copies"]

        def settled(url: str) -> bool:
            return (
                scalar(
                    url,
                    "SELECT count(*) FROM ingress_rawevent WHERE signature_status = 'verified' "
                    "AND dispatch_status IN ('dispatched', 'duplicate')",
                )
                == copies
            )

        def handled() -> bool:
            return scalar(urls["eu"], "SELECT count(*) FROM bench_handlerrun") >= EVENTS

        wait_until(
            lambda: settled(urls["eu"]) and settled(urls["us"]) and handled(),
            "every copy stored and settled in both regions, every event handled",
            lambda: {name: settled_summary(url) for name, url in urls.items()},
            processes,
            timeout=DRAIN_SECONDS,
        )
        drained_seconds = time.monotonic() - started

        for name, url in urls.items():
            # Every copy, with the region that received it, in both databases.
            per_region = dict(
                query(url, "SELECT region, count(*) FROM ingress_rawevent GROUP BY 1")
            )
            assert per_region == sent["per_region"], (name, per_region)
            # One winner per provider event; the other copy a duplicate of it, visibly.
            winners = query(
                url,
                "SELECT dedup_key, count(*) FILTER (WHERE dispatch_status = 'dispatched'), "
                "count(*) FILTER (WHERE dispatch_status = 'duplicate'), "
                "count(DISTINCT region) FROM ingress_rawevent GROUP BY dedup_key",
            )
            assert len(winners) == EVENTS
            assert all(first == 1 for _, first, _, _ in winners), name
            assert sum(dups for _, _, dups, _ in winners) == EVENTS // BOTH_EVERY + (
                1 if EVENTS % BOTH_EVERY else 0
            )
            assert scalar(
                url,
                "SELECT count(*) FROM ingress_rawevent d JOIN ingress_rawevent w "
                "ON w.id = d.duplicate_of_id AND w.dispatch_status = 'dispatched' "
                "WHERE d.dispatch_status = 'duplicate'",
            ) == sum(dups for _, _, dups, _ in winners)
            # The deliveries the processing region wrote, done, in both regions.
            assert dict(query(url, "SELECT status, count(*) FROM ingress_delivery GROUP BY 1")) == {
                "done": EVENTS
            }, name
        # Handled exactly once: one handler run per provider event, never for a duplicate,
        # and only in the processing region.
        runs = query(
            urls["eu"],
            "SELECT r.dedup_key, count(*) FROM bench_handlerrun h JOIN ingress_rawevent r "
            "ON r.id = h.raw_event_id GROUP BY 1",
        )
        assert len(runs) == EVENTS and all(count == 1 for _, count in runs)
        assert scalar(urls["us"], "SELECT count(*) FROM bench_handlerrun") == 0
        # Ids never collide: each region's rows carry its own id block.
        for name, url in urls.items():
            assert (
                scalar(
                    url,
                    "SELECT count(*) FROM ingress_rawevent "
                    "WHERE (region = 'eu') <> (id < 2::bigint << 48)",
                )
                == 0
            ), name

        # A row restored from an archive (retention dropped it here, the peer still holds
        # it) is not published again: a second INSERT of the same key would stop the peer's
        # apply worker. Dropped and restored as retention and restore_raw_events do, the
        # delete bypassing the deliveries' references as a partition drop does.
        restored = scalar(urls["eu"], "SELECT min(id) FROM ingress_rawevent WHERE region = 'eu'")
        with psycopg.connect(urls["eu"]) as conn:
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(
                "CREATE TEMP TABLE dropped ON COMMIT DROP AS "
                "SELECT * FROM ingress_rawevent WHERE id = %s",
                (restored,),
            )
            conn.execute("DELETE FROM ingress_rawevent WHERE id = %s", (restored,))
            conn.execute("UPDATE dropped SET origin = 'restored', restored_at = now()")
            conn.execute("INSERT INTO ingress_rawevent SELECT * FROM dropped")

        lags = {
            "eu->us": [replication_lag(urls, ports, "eu", "us") for _ in range(5)],
            "us->eu": [replication_lag(urls, ports, "us", "eu") for _ in range(5)],
        }
        print(
            f"\nmulti-region: {EVENTS} events, {copies} copies sent in {send_seconds:.1f} s, "
            f"stored, replicated, settled and handled after {drained_seconds:.1f} s; "
            f"lag max eu->us {max(lags['eu->us']):.3f} s, us->eu {max(lags['us->eu']):.3f} s"
        )
        assert max(max(lag) for lag in lags.values()) < 10
        apply_errors = "SELECT sum(apply_error_count) FROM pg_stat_subscription_stats"
        assert scalar(urls["us"], apply_errors) == 0
        assert (
            scalar(urls["us"], "SELECT origin FROM ingress_rawevent WHERE id = %s", (restored,))
            == "received"
        )
        # The lag probes are events too: handled in eu, before the switch.
        handled_before = EVENTS + sum(len(lag) for lag in lags.values())
        wait_until(
            lambda: scalar(urls["eu"], "SELECT count(*) FROM bench_handlerrun") == handled_before,
            "the lag probes handled",
            lambda: settled_summary(urls["eu"]),
            processes,
            timeout=60,
        )

        # --- the operator moves processing to us: eu stops before us starts ---------------
        manage(
            "shell",
            "-c",
            "from regions.services import processing_region_set; "
            "processing_region_set(region='us', reason='planned switch')",
            env=envs["eu"],
        )
        wait_until(
            lambda: lease_epoch(urls["us"], "us") == 2,
            "us holding the lease of epoch 2",
            lambda: query(urls["us"], "SELECT * FROM regions_regionstate"),
            processes,
            timeout=60,
        )
        # eu acknowledged epoch 2 before us took its lease, and holds none of epoch 2.
        eu_row = query(
            urls["us"], "SELECT seen_epoch, lease_epoch FROM regions_regionstate WHERE name = 'eu'"
        )
        assert eu_row == [(2, 1)]
        # The state publications follow processing: eu's emptied when it acknowledged, us's
        # filled when it started (eventdrop_region_publish_state).
        state_tables = "SELECT count(*) FROM pg_publication_tables WHERE pubname IN (%s, %s)"
        assert (
            scalar(urls["eu"], state_tables, ("eventdrop_state_raw_eu", "eventdrop_state_eu")) == 0
        )
        assert (
            scalar(urls["us"], state_tables, ("eventdrop_state_raw_us", "eventdrop_state_us")) > 1
        )
        after = send_all(ports, ["eu", "us"], "after", 100)
        assert after["not_202"] == []

        def handled_in_us() -> bool:
            return scalar(urls["us"], "SELECT count(*) FROM bench_handlerrun") >= 100

        wait_until(
            handled_in_us,
            "the events after the switch handled in us",
            lambda: settled_summary(urls["us"]),
            processes,
            timeout=60,
        )
        time.sleep(1)  # anything that would run twice has had its chance
        assert scalar(urls["us"], "SELECT count(*) FROM bench_handlerrun") == 100
        assert scalar(urls["eu"], "SELECT count(*) FROM bench_handlerrun") == handled_before
        # eu sees us's work: the deliveries us wrote arrive in eu.
        wait_until(
            lambda: (
                scalar(urls["eu"], "SELECT count(*) FROM ingress_delivery WHERE status = 'done'")
                == handled_before + 100
            ),
            "us's deliveries replicated to eu",
            lambda: query(urls["eu"], "SELECT status, count(*) FROM ingress_delivery GROUP BY 1"),
            processes,
            timeout=60,
        )
    finally:
        for process in processes:
            process.stop(grace=5)


KILL_EVENTS = int(os.environ.get("MULTI_REGION_KILL_EVENTS", "400"))


def send_rerouting(ports: dict[str, int], prefix: str, count: int, up: Callable[[], list[str]]):
    """Each event to one region (alternating among those `up` says are up), every tenth to
    both; an answer other than 202 is retried in another region, as a provider retries
    through the load balancer. Returns (event id -> regions that answered 202)."""
    acked: dict[str, list[str]] = {}

    def deliver(n: int) -> None:
        event_id = f"evt_{prefix}_{n}"
        regions = up()
        wanted = regions if n % BOTH_EVERY == 0 else [regions[n % len(regions)]]
        for region in wanted:
            for attempt in range(10):
                target = region if attempt == 0 else up()[attempt % len(up())]
                try:
                    status = post(ports[target], event_id)
                except requests.RequestException:
                    status = None
                if status == 202:
                    acked.setdefault(event_id, []).append(target)
                    break

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(deliver, range(count)))
    return acked


def test_a_region_melts_the_other_takes_over_and_nothing_is_lost(tmp_path: Path):
    with two_regions() as regions:
        run_melt(tmp_path, regions.clusters["eu"], regions.urls, regions.envs)


def run_melt(tmp_path: Path, eu_db: Cluster, urls: dict[str, str], envs: dict) -> None:
    ports = {"eu": free_port(), "us": free_port()}
    fleet: dict[str, Managed] = {}

    def start(name: str, region: str, kind: str, generation: int = 1) -> None:
        log = tmp_path / f"{name}.{generation}.log"
        port = ports[region] if kind == "web" else None
        fleet[name] = start_procfile(kind, envs[region], port=port, log=log)

    try:
        for region in ("eu", "us"):
            start(f"web-{region}", region, "web")
            start(f"inbox-{region}", region, "inbox")
        for region in ("eu", "us"):
            fleet[f"web-{region}"].wait_listening(ports[region], timeout=60)
        regions_up = ["eu", "us"]
        us_processes = [fleet["web-us"], fleet["inbox-us"]]

        # eu melts while it processes: once it has handled a third of the first batch.
        with ThreadPoolExecutor(max_workers=1) as background:
            first = background.submit(
                send_rerouting, ports, "melt", KILL_EVENTS, lambda: list(regions_up)
            )
            wait_until(
                lambda: (
                    scalar(urls["eu"], "SELECT count(*) FROM bench_handlerrun") >= KILL_EVENTS // 3
                ),
                "eu handling a third of the first batch",
                lambda: settled_summary(urls["eu"]),
                us_processes,
                timeout=120,
            )
            kill_cluster(eu_db)
            regions_up.remove("eu")
            acked = first.result(timeout=300)
        # us kept answering 202 for what it stored: every event was acknowledged somewhere.
        assert len(acked) == KILL_EVENTS
        second = send_rerouting(ports, "after", KILL_EVENTS // 2, lambda: ["us"])
        assert len(second) == KILL_EVENTS // 2

        # What eu had handled and us knew of at the takeover: eu's state that replicated (read
        # before it, while us does not process: after it, us works eu's orphaned claims).
        known_done = {
            event_id(key)
            for (key,) in query(
                urls["us"],
                "SELECT r.dedup_key FROM ingress_delivery d JOIN ingress_rawevent r "
                "ON r.id = d.raw_event_id WHERE d.status = 'done'",
            )
        }

        # The operator takes over in us once eu's lease, as replicated there, has run out.
        deadline = time.monotonic() + 60
        while True:
            try:
                manage(
                    "shell",
                    "-c",
                    "from regions.services import processing_region_set; "
                    "processing_region_set(region='us', peer_lost=True, reason='eu melted')",
                    env=envs["us"],
                )
                break
            except RuntimeError as refused:
                assert "holds the processing lease" in str(refused)
                assert time.monotonic() < deadline, "eu's lease never ran out in us"
                time.sleep(0.5)
        # eu returns; its processes restart with it. It must not process (fenced).
        eu_db.start()
        for name in ("web-eu", "inbox-eu"):
            fleet[name].stop(grace=2)
            start(name, "eu", name.split("-")[0], generation=2)
        fleet["web-eu"].wait_listening(ports["eu"], timeout=60)

        every_event = set(acked) | set(second)
        copies_acked = sum(len(regions) for regions in (*acked.values(), *second.values()))

        def drained() -> bool:
            stored = scalar(urls["us"], "SELECT count(*) FROM ingress_rawevent")
            pending = scalar(
                urls["us"],
                "SELECT count(*) FROM ingress_rawevent WHERE signature_status = 'pending'",
            )
            return stored >= copies_acked and pending == 0

        wait_until(
            drained,
            "every acknowledged copy in us, settled",
            lambda: (copies_acked, settled_summary(urls["us"])),
            us_processes,
            timeout=120,
        )
        # Nothing lost: every event acknowledged in either region is in us, one winner each.
        winners = {
            event_id(key): count
            for key, count in query(
                urls["us"],
                "SELECT dedup_key, count(*) FILTER (WHERE dispatch_status = 'dispatched') "
                "FROM ingress_rawevent GROUP BY 1",
            )
        }
        assert set(winners) == every_event, sorted(set(winners) ^ every_event)[:5]
        assert all(count == 1 for count in winners.values())

        runs = handler_runs

        wait_until(
            lambda: len(runs(urls["us"]) + runs(urls["eu"])) >= len(every_event),
            "every event handled in one region or the other",
            lambda: (len(runs(urls["us"])), len(runs(urls["eu"]))),
            us_processes,
            timeout=120,
        )
        in_us, in_eu = runs(urls["us"]), runs(urls["eu"])
        assert max(in_us.values()) == 1 and max(in_eu.values(), default=1) == 1
        # eu's claims that had replicated were taken back and worked in us: none left.
        wait_until(
            lambda: (
                not scalar(
                    urls["us"], "SELECT count(*) FROM ingress_delivery WHERE status = 'processing'"
                )
            ),
            "no delivery left processing in us",
            lambda: settled_summary(urls["us"]),
            us_processes,
            timeout=60,
        )
        twice = set(in_us) & set(in_eu)
        # Handled in both regions only inside the at-least-once window: eu handled it and its
        # state had not reached us when eu melted (docs/multi-region.md).
        assert not twice & known_done, sorted(twice & known_done)[:5]
        # eu, back, did not process: none of its handler runs is of an event it saw after.
        assert not any(key.startswith("evt_after_") for key in in_eu)
        print(
            f"\nmelt: {len(every_event)} events, eu killed after "
            f"{len(in_eu)} handled there; handled in both (the window): {len(twice)}"
        )
    finally:
        for process in fleet.values():
            process.stop(grace=5)


def store_old_events(env: dict[str, str], prefix: str, count: int, received_at: datetime) -> None:
    """Raw events as the receive path stores them (the model's defaults, this region's name),
    received at `received_at` and signed then (verification measures the tolerance against
    received_at)."""
    rows = []
    secret = TEST_SECRETS["STRIPE_WEBHOOK_SECRET"].encode()
    for n in range(count):
        body = stripe_event(f"{prefix}_{n}", EVENT_TYPE, {"id": f"pi_{prefix}_{n}"})
        timestamp = int(received_at.timestamp())
        digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
        rows.append({"body": body.hex(), "signature": f"t={timestamp},v1={digest}"})
    script = (
        "import hashlib, json\n"
        "from datetime import datetime\n"
        "from ingress.models import RawEvent\n"
        f"for row in json.loads({json.dumps(json.dumps(rows))}):\n"
        "    body = bytes.fromhex(row['body'])\n"
        "    RawEvent.objects.create(source='stripe', provider='stripe', method='POST',\n"
        "        path='/webhooks/stripe/', headers={'stripe-signature': row['signature']},\n"
        "        body=body, body_sha256=hashlib.sha256(body).hexdigest(),\n"
        f"        received_at=datetime.fromisoformat({received_at.isoformat()!r}))\n"
    )
    manage("shell", "-c", script, env=env)


def test_duplicates_inside_the_lag_and_a_partition_dropped_under_undelivered_rows(
    tmp_path: Path,
):
    with two_databases() as regions:
        urls, envs = regions.urls, regions.envs
        # A day long past retention, with its partition in both regions.
        day = (datetime.now(UTC) - timedelta(days=200)).date()
        start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
        for url in urls.values():
            execute(
                url,
                f"CREATE TABLE ingress_rawevent_p{day:%Y%m%d} PARTITION OF ingress_rawevent "
                f"FOR VALUES FROM ('{start.isoformat()}') "
                f"TO ('{(start + timedelta(days=1)).isoformat()}')",
            )
        set_up_both(envs)
        run_lag_and_retention(tmp_path, urls, envs, day, start)


def run_lag_and_retention(tmp_path, urls, envs, day, start) -> None:
    ports = {"eu": free_port(), "us": free_port()}
    processes: list[Managed] = []
    try:
        for name in ("eu", "us"):
            processes.append(
                start_procfile("web", envs[name], port=ports[name], log=tmp_path / f"web-{name}")
            )
            processes.append(start_procfile("inbox", envs[name], log=tmp_path / f"inbox-{name}"))
        for process, port in zip(processes[::2], ports.values(), strict=True):
            process.wait_listening(port, timeout=60)

        # eu processing (us acknowledged it, eu holds the lease), then the stream from us
        # into eu held back: whatever us stores now is inside the replication lag. eu keeps
        # processing on its lease while us's heartbeats do not reach it.
        wait_until(
            lambda: lease_epoch(urls["eu"], "eu") == 1,
            "eu holding the lease",
            lambda: query(urls["eu"], "SELECT * FROM regions_regionstate"),
            processes,
            timeout=60,
        )
        execute(urls["eu"], "ALTER SUBSCRIPTION eventdrop_eu_from_us DISABLE")
        # Both orders: us first then eu, and eu first then us.
        assert post(ports["us"], "evt_lag_us_first") == 202
        assert post(ports["eu"], "evt_lag_us_first") == 202
        assert post(ports["eu"], "evt_lag_eu_first") == 202
        assert post(ports["us"], "evt_lag_eu_first") == 202
        # us also holds undelivered rows of the old day, and eu processed its own of that day
        # and drops the partition by retention: in eu's view nothing of it is in flight.
        store_old_events(envs["us"], "evt_old_us", 20, start)
        store_old_events(envs["eu"], "evt_old_eu", 5, start)
        wait_until(
            lambda: (
                scalar(urls["eu"], "SELECT count(*) FROM bench_handlerrun") == 7
            ),  # the two events' eu copies and the five old ones
            "eu handling what it has",
            lambda: settled_summary(urls["eu"]),
            processes,
            timeout=60,
        )
        dropped = manage("raw_event_partitions", env=envs["eu"]).stdout
        assert f"drop ingress_rawevent_p{day:%Y%m%d}" in dropped, dropped
        execute(urls["eu"], "ALTER SUBSCRIPTION eventdrop_eu_from_us ENABLE")

        def all_handled() -> bool:
            return scalar(urls["eu"], "SELECT count(*) FROM bench_handlerrun") == 27

        wait_until(
            all_handled,
            "us's rows replicated and handled in eu",
            lambda: settled_summary(urls["eu"]),
            processes,
            timeout=60,
        )
        # Nothing lost: us's rows of the dropped day arrived (into the DEFAULT partition) and
        # were handled; each event once.
        keys = Counter(
            event_id(key)
            for (key,) in query(
                urls["eu"],
                "SELECT r.dedup_key FROM bench_handlerrun h JOIN ingress_rawevent r "
                "ON r.id = h.raw_event_id",
            )
        )
        # 27 runs; eu's own five rows of the old day went with their partition (handled).
        assert all(count == 1 for count in keys.values()) and len(keys) == 27 - 5
        assert {f"evt_old_us_{n}" for n in range(20)} <= set(keys)
        # Duplicates inside the lag, both orders: one winner each, the other copy a visible
        # duplicate of it, in both regions once us has the state.
        for url in urls.values():
            wait_until(
                functools.partial(lag_copies_settled, url),
                "both copies of both events settled",
                functools.partial(lag_copies, url),
                processes,
                timeout=60,
            )
            copies = lag_copies(url)
            for event in ("evt_lag_us_first", "evt_lag_eu_first"):
                mine = [c for c in copies if c[0] == event]
                statuses = sorted(status for _, status, _ in mine)
                assert statuses == ["dispatched", "duplicate"], (url, mine)
        print(f"\nretention: eu dropped p{day:%Y%m%d}; us's 20 rows of that day handled in eu")
    finally:
        for process in processes:
            process.stop(grace=5)


def lag_copies(url: str) -> list[tuple]:
    return [
        (event_id(key or ""), status, region)
        for key, status, region in query(
            url,
            "SELECT dedup_key, dispatch_status, region FROM ingress_rawevent "
            "WHERE encode(body, 'hex') LIKE %s OR encode(body, 'hex') LIKE %s",
            (f"%{b'evt_lag_us_first'.hex()}%", f"%{b'evt_lag_eu_first'.hex()}%"),
        )
    ]


def lag_copies_settled(url: str) -> bool:
    copies = lag_copies(url)
    return len(copies) == 4 and all(
        status in ("dispatched", "duplicate") for _, status, _ in copies
    )
