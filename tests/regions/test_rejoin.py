"""The old processing region returns after a takeover and rejoins (issue 32), on real
processes: two throw-away PostgreSQL 15 clusters, a web server and an inbox worker per
region (tests/regions/support.py).

The tail is made deterministic: the stream from eu into us is held back (us's subscription
disabled) before eu handles a batch, so every state row of that batch exists only in eu when
eu's cluster is SIGKILLed. us takes over, handles what it receives, eu returns: us gets eu's
raw events and handles them again (the at-least-once window), and its state for them meets
eu's tail in eu — a unique violation that stops eu's apply worker, over and over. Then
`region_setup --rejoin` in eu lists the tail (exactly the rows eu wrote and us lacks) and
re-copies eu's state tables from us. Afterwards: eu's apply worker runs without errors, the
state tables are the same in both, new events are handled once, a planned switch back to eu
works, and nothing acknowledged is lost.
"""

import json
import re
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import requests

from tests.regions.support import (
    decide,
    event_id,
    execute,
    handler_runs,
    kill_cluster,
    lease_epoch,
    post,
    query,
    region_setup,
    scalar,
    settled_summary,
    signed_post,
    take_over,
    two_regions,
)
from tests.support.processes import (
    Managed,
    free_port,
    manage,
    start_manage,
    start_procfile,
    wait_until,
)

pytestmark = pytest.mark.faults

BEFORE, TAIL, DURING, AFTER = 40, 25, 15, 20
EU_BLOCK = (1 << 48, 2 << 48)
TAIL_TABLES = ("ingress_dedupkey", "ingress_delivery", "ingress_deliveryattempt")


runs = handler_runs


def ids(url: str, table: str) -> set[int]:
    return {row[0] for row in query(url, f"SELECT id FROM {table}")}  # noqa: S608


def apply_errors(url: str) -> int:
    return scalar(url, "SELECT coalesce(sum(apply_error_count), 0) FROM pg_stat_subscription_stats")


def apply_worker_running(url: str) -> bool:
    return bool(
        scalar(
            url,
            "SELECT count(*) FROM pg_stat_subscription WHERE relid IS NULL AND pid IS NOT NULL",
        )
    )


def peer_beat_age(url: str, peer: str) -> float:
    """Seconds since the peer's heartbeat as replicated here: the lag's upper bound."""
    return float(
        scalar(
            url,
            "SELECT extract(epoch FROM now() - heartbeat_at) FROM regions_regionstate "
            "WHERE name = %s",
            (peer,),
        )
    )


def send(ports: dict[str, int], regions: list[str], prefix: str, count: int) -> set[str]:
    sent = set()
    for n in range(count):
        name = f"evt_{prefix}_{n}"
        assert post(ports[regions[n % len(regions)]], name) == 202
        sent.add(name)
    return sent


def listed(output: str, table: str, kind: str) -> set[str]:
    """The keys `region_setup --rejoin` printed for one table and kind."""
    line = next((line for line in output.splitlines() if f"tail {table}:" in line), "")
    match = re.search(rf"\d+ {kind} \[([^\]]*)\]", line)
    return set(match.group(1).split(", ")) if match else set()


def test_the_old_processing_region_rejoins_after_a_takeover(tmp_path: Path):
    with two_regions() as pair:
        run_rejoin(tmp_path, pair)


def run_rejoin(tmp_path: Path, pair) -> None:
    urls, envs, eu_db = pair.urls, pair.envs, pair.clusters["eu"]
    ports = {"eu": free_port(), "us": free_port()}
    fleet: dict[str, Managed] = {}

    def start(region: str, generation: int = 1) -> None:
        for kind in ("web", "inbox"):
            log = tmp_path / f"{kind}-{region}.{generation}.log"
            port = ports[region] if kind == "web" else None
            fleet[f"{kind}-{region}"] = start_procfile(kind, envs[region], port=port, log=log)
        fleet[f"web-{region}"].wait_listening(ports[region], timeout=60)

    def alive() -> list[Managed]:
        return [process for process in fleet.values() if process.alive]

    try:
        start("eu")
        start("us")
        # --- eu processes; its state reaches us -------------------------------------------
        before = send(ports, ["eu", "us"], "before", BEFORE)
        wait_until(
            lambda: (
                scalar(urls["us"], "SELECT count(*) FROM ingress_delivery WHERE status = 'done'")
                == BEFORE
            ),
            "the first batch handled in eu, its deliveries in us",
            lambda: (len(runs(urls["eu"])), settled_summary(urls["us"])),
            alive(),
            timeout=60,
        )
        # --- the tail: the stream from eu into us held back, eu handles a batch ---------------
        execute(urls["us"], "ALTER SUBSCRIPTION eventdrop_us_from_eu DISABLE")
        tail_events = send(ports, ["eu"], "tail", TAIL)
        wait_until(
            lambda: len(runs(urls["eu"])) == BEFORE + TAIL,
            "eu handling the tail batch",
            lambda: settled_summary(urls["eu"]),
            alive(),
            timeout=60,
        )
        expected_tail = {
            table: {i for i in ids(urls["eu"], table) if EU_BLOCK[0] <= i < EU_BLOCK[1]}
            - ids(urls["us"], table)
            for table in TAIL_TABLES
        }
        assert all(len(expected_tail[table]) >= TAIL for table in TAIL_TABLES), expected_tail
        # --- eu melts; us takes over and works alone ----------------------------------------
        kill_cluster(eu_db)
        for name in ("web-eu", "inbox-eu"):
            fleet[name].stop(grace=2)
        us_processes = [fleet["web-us"], fleet["inbox-us"]]
        take_over(envs["us"], "us")
        execute(urls["us"], "ALTER SUBSCRIPTION eventdrop_us_from_eu ENABLE")
        during = send(ports, ["us"], "during", DURING)
        wait_until(
            lambda: len(runs(urls["us"])) == DURING,
            "us handling what it received during the melt",
            lambda: settled_summary(urls["us"]),
            us_processes,
            timeout=60,
        )
        # --- eu returns: us gets its raw events and handles the tail's again (the window);
        # us's state for them meets eu's tail in eu and stops eu's apply worker.
        eu_db.start()
        start("eu", generation=2)
        wait_until(
            lambda: len(runs(urls["us"])) == DURING + TAIL,
            "us handling eu's tail events, received after eu's return",
            lambda: settled_summary(urls["us"]),
            alive(),
            timeout=60,
        )
        wait_until(
            lambda: apply_errors(urls["eu"]) > 0,
            "eu's apply worker stopped by us's state meeting eu's tail",
            lambda: query(urls["eu"], "SELECT * FROM pg_stat_subscription_stats"),
            alive(),
            timeout=60,
        )
        # --- the rejoin -----------------------------------------------------------------------
        with pytest.raises(RuntimeError, match="is the processing region"):
            manage("region_setup", "--rejoin", env=envs["us"])
        started = time.monotonic()
        output = region_setup(envs["eu"], "--rejoin")
        rejoin_seconds = time.monotonic() - started
        print(f"\n{output}")
        for table in TAIL_TABLES:
            assert listed(output, table, "never sent") == set(map(str, expected_tail[table]))
        assert "state tables copied from us" in output
        errors_after_rejoin = apply_errors(urls["eu"])
        for table in TAIL_TABLES:
            assert not ids(urls["eu"], table) & expected_tail[table], table
        # us takes eu's state publications again once eu acknowledged the takeover.
        wait_until(
            lambda: (
                scalar(urls["us"], "SELECT seen_epoch FROM regions_regionstate WHERE name = 'eu'")
                >= 2
            ),
            "eu acknowledging the takeover, seen in us",
            lambda: query(urls["us"], "SELECT * FROM regions_regionstate"),
            alive(),
            timeout=60,
        )
        assert "now takes" in region_setup(envs["us"])
        # Again: nothing left to list or repair, nothing changed.
        again = region_setup(envs["eu"], "--rejoin")
        assert "never sent" not in again and "nothing to repair" in again, again
        # --- afterwards: new events in us, then a planned switch back to eu -------------------
        after = send(ports, ["eu", "us"], "after", AFTER)
        wait_until(
            lambda: len(runs(urls["us"])) == DURING + TAIL + AFTER,
            "the events after the rejoin handled in us",
            lambda: settled_summary(urls["us"]),
            alive(),
            timeout=60,
        )
        decide(envs["us"], "eu", reason="planned switch back after the rejoin")
        wait_until(
            lambda: lease_epoch(urls["eu"], "eu") == 3,
            "eu processing again (epoch 3)",
            lambda: query(urls["eu"], "SELECT * FROM regions_regionstate"),
            alive(),
            timeout=60,
        )
        back = send(ports, ["eu", "us"], "back", AFTER)
        everything = before | tail_events | during | after | back
        done_everywhere = len(everything)

        wait_until(
            lambda: len(runs(urls["eu"])) == BEFORE + TAIL + AFTER,
            "the events after the switch back handled in eu",
            lambda: settled_summary(urls["eu"]),
            alive(),
            timeout=60,
        )
        wait_until(
            # One delivery per event: the tail's first ones, done in eu before the melt,
            # were emptied by the rejoin; us's for the same events remain.
            lambda: all(
                scalar(url, "SELECT count(*) FROM ingress_delivery WHERE status = 'done'")
                == done_everywhere
                for url in urls.values()
            ),
            "every delivery done, in both regions",
            lambda: {
                name: query(url, "SELECT status, count(*) FROM ingress_delivery GROUP BY 1")
                for name, url in urls.items()
            },
            alive(),
            timeout=60,
        )
        # Nothing lost, each event one winner in both regions, the same state in both.
        for name, url in urls.items():
            winners = dict(
                query(
                    url,
                    "SELECT dedup_key, count(*) FILTER (WHERE dispatch_status = 'dispatched') "
                    "FROM ingress_rawevent GROUP BY 1",
                )
            )
            assert {event_id(key) for key in winners} == everything, name
            assert set(winners.values()) == {1}, name
        for table in TAIL_TABLES:
            assert ids(urls["eu"], table) == ids(urls["us"], table), table
        # Handled once, except the tail: once in eu before the melt and once in us after.
        handled = runs(urls["eu"]) + runs(urls["us"])
        assert set(handled) == everything
        assert {event for event, count in handled.items() if count > 1} == tail_events
        assert max(handled.values()) == 2
        # No subscription stopped since the rejoin: both apply workers run, no new error,
        # each region's view of the other's heartbeat young.
        for url in urls.values():
            assert apply_worker_running(url)
        assert apply_errors(urls["eu"]) == errors_after_rejoin
        assert apply_errors(urls["us"]) == 0
        lags = {
            "us->eu": peer_beat_age(urls["eu"], "us"),
            "eu->us": peer_beat_age(urls["us"], "eu"),
        }
        assert max(lags.values()) < 5, lags
        sizes = ", ".join(f"{table} {len(expected_tail[table])}" for table in TAIL_TABLES)
        ages = ", ".join(f"{way} {age:.2f} s" for way, age in lags.items())
        print(
            f"rejoin: a tail of {TAIL} events ({sizes}) listed and repaired in "
            f"{rejoin_seconds:.1f} s; heartbeat age afterwards: {ages}"
        )
    finally:
        for process in fleet.values():
            process.stop(grace=5)


# --- the recap outbox across a melt -----------------------------------------------------------

RECAPS_BEFORE, RECAPS_TAIL, RECAPS_DURING = 6, 6, 6
RENDER_SETTINGS = {
    # A lost completion is asked about a second after the render started (not the
    # production quarter of an hour), so that a render retried after the takeover, which
    # the service answers from its idempotency key without a second callback, completes.
    "RENDER_EXPECTED_SECONDS": "1",
    "RENDER_CALLBACK_MARGIN_SECONDS": "0",
    "RENDER_CHECK_INTERVAL_SECONDS": "5",
    "OUTBOX_IDLE_SLEEP_SECONDS": "0.2",
}


def checkout_completed(recap_id: str) -> bytes:
    return json.dumps(
        {
            "id": f"evt_paid_{recap_id}",
            "object": "event",
            "type": "checkout.session.completed",
            "created": int(time.time()),
            "data": {
                "object": {
                    "id": f"cs_{recap_id}",
                    "object": "checkout.session",
                    "payment_status": "paid",
                    "payment_intent": f"pi_{recap_id}",
                    "metadata": {"recap_id": recap_id},
                }
            },
        }
    ).encode()


def recap_statuses(url: str, recap_ids: list[str]) -> Counter:
    return Counter(
        status
        for (status,) in query(
            url, "SELECT status FROM recap_videos WHERE id = ANY(%s::uuid[])", (recap_ids,)
        )
    )


def all_ready(url: str, recap_ids: list[str]) -> bool:
    return recap_statuses(url, recap_ids) == Counter({"ready": len(recap_ids)})


def render_stats(port: int) -> dict:
    return requests.get(f"http://127.0.0.1:{port}/_stats", timeout=(2, 5)).json()


def test_paid_recaps_are_rendered_once_across_a_melt(tmp_path: Path):
    render_port = free_port()
    with two_regions(
        RENDER_SERVICE_URL=f"http://127.0.0.1:{render_port}", **RENDER_SETTINGS
    ) as pair:
        run_outbox_melt(tmp_path, pair, render_port)


def run_outbox_melt(tmp_path: Path, pair, render_port: int) -> None:
    urls, envs, eu_db = pair.urls, pair.envs, pair.clusters["eu"]
    ports = {"eu": free_port(), "us": free_port()}
    for region in ("eu", "us"):
        # Each region's dispatcher asks for the callback at its own web server.
        envs[region]["RENDER_CALLBACK_URL"] = f"http://127.0.0.1:{ports[region]}/webhooks/renderer/"
    total = RECAPS_BEFORE + RECAPS_TAIL + RECAPS_DURING
    recap_ids = [str(uuid.uuid4()) for _ in range(total)]
    before = recap_ids[:RECAPS_BEFORE]
    tail = recap_ids[RECAPS_BEFORE : RECAPS_BEFORE + RECAPS_TAIL]
    during = recap_ids[RECAPS_BEFORE + RECAPS_TAIL :]
    for region in ("eu", "us"):
        manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User; User.objects.create(username='buyer')",
            env=envs[region],
        )
    fleet: dict[str, Managed] = {
        "renderer": start_manage(
            ["run_fake_renderer", "--port", str(render_port), "--complete-after", "0.05"],
            envs["us"],
            log=tmp_path / "renderer.log",
        )
    }

    def start(region: str, generation: int = 1) -> None:
        for kind in ("web", "inbox", "dispatcher"):
            log = tmp_path / f"{kind}-{region}.{generation}.log"
            port = ports[region] if kind == "web" else None
            fleet[f"{kind}-{region}"] = start_procfile(kind, envs[region], port=port, log=log)
        fleet[f"web-{region}"].wait_listening(ports[region], timeout=60)

    def alive() -> list[Managed]:
        return [process for process in fleet.values() if process.alive]

    def pay(region: str, recaps: list[str]) -> None:
        for recap_id in recaps:
            assert signed_post(ports[region], checkout_completed(recap_id)) == 202

    try:
        fleet["renderer"].wait_listening(render_port, timeout=30)
        start("eu")
        start("us")
        # The recaps, waiting for their payment, written in the processing region once it
        # processes (its state publications are filled then).
        wait_until(
            lambda: lease_epoch(urls["eu"], "eu") == 1,
            "eu processing",
            lambda: query(urls["eu"], "SELECT * FROM regions_regionstate"),
            alive(),
            timeout=60,
        )
        manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User\n"
            "from recaps.models import Event, Photo, RecapVideo\n"
            "event = Event.objects.create(title='melt')\n"
            "for n in range(5):\n"
            "    Photo.objects.create(event=event, storage_key=f'events/melt/{n}.jpg')\n"
            "buyer = User.objects.get(username='buyer')\n"
            f"for recap_id in {recap_ids!r}:\n"
            "    RecapVideo.objects.create(id=recap_id, event=event, buyer=buyer)\n",
            env=envs["eu"],
        )
        wait_until(
            lambda: scalar(urls["us"], "SELECT count(*) FROM recap_videos") == total,
            "the recaps replicated to us",
            lambda: scalar(urls["us"], "SELECT count(*) FROM recap_videos"),
            alive(),
            timeout=60,
        )
        # --- paid and rendered in eu, replicated --------------------------------------------
        pay("eu", before[::2])
        pay("us", before[1::2])
        wait_until(
            lambda: all_ready(urls["eu"], before) and all_ready(urls["us"], before),
            "the first recaps rendered in eu, ready in both regions",
            lambda: (recap_statuses(urls["eu"], before), recap_statuses(urls["us"], before)),
            alive(),
            timeout=60,
        )
        # --- the tail: paid, rendered and ready in eu while its stream to us is held back -----
        execute(urls["us"], "ALTER SUBSCRIPTION eventdrop_us_from_eu DISABLE")
        pay("eu", tail)
        wait_until(
            lambda: all_ready(urls["eu"], tail),
            "the tail's recaps rendered and ready in eu",
            lambda: recap_statuses(urls["eu"], tail),
            alive(),
            timeout=60,
        )
        assert recap_statuses(urls["us"], tail) == Counter({"pending_payment": RECAPS_TAIL})
        kill_cluster(eu_db)
        for kind in ("web", "inbox", "dispatcher"):
            fleet[f"{kind}-eu"].stop(grace=2)
        # --- us takes over; recaps paid during the melt are rendered from us -----------------
        take_over(envs["us"], "us")
        execute(urls["us"], "ALTER SUBSCRIPTION eventdrop_us_from_eu ENABLE")
        pay("us", during)
        wait_until(
            lambda: all_ready(urls["us"], during),
            "the recaps paid during the melt rendered from us",
            lambda: recap_statuses(urls["us"], during),
            alive(),
            timeout=60,
        )
        # --- eu returns: its payments reach us, which renders the tail's recaps again --------
        eu_db.start()
        start("eu", generation=2)
        wait_until(
            lambda: all_ready(urls["us"], recap_ids),
            "every paid recap ready in us",
            lambda: recap_statuses(urls["us"], recap_ids),
            alive(),
            timeout=90,
        )
        output = region_setup(envs["eu"], "--rejoin")
        # eu's tail: its side effects for the tail's recaps (us wrote its own since), and
        # those recaps as eu left them, ready with eu's timestamps.
        assert len(listed(output, "recap_side_effects", "never sent")) == RECAPS_TAIL, output
        assert set(tail) <= listed(output, "recap_videos", "differ"), output
        wait_until(
            lambda: all_ready(urls["eu"], recap_ids),
            "every recap ready in eu after the rejoin",
            lambda: recap_statuses(urls["eu"], recap_ids),
            alive(),
            timeout=60,
        )
        # Each recap's render received once by the render service: one key per recap, each
        # accepted once; a key posted again (the tail's, retried from us) was recognised.
        keys = {
            recap_id: f"recap-{recap_id}-{effect}-g{generation}"
            for recap_id, effect, generation in query(
                urls["us"],
                "SELECT recap_id::text, effect_type, key_generation FROM recap_side_effects",
            )
        }
        assert set(keys) == set(recap_ids)
        stats = render_stats(render_port)
        assert set(stats["posts_by_key"]) == set(keys.values()), stats["posts_by_key"]
        assert stats["accepted"] == total, stats
        retried = {key for key, posts in stats["posts_by_key"].items() if posts > 1}
        assert retried <= {keys[recap_id] for recap_id in tail}, retried
        # The video each recap shows is the one render it had, in both regions.
        videos = [
            dict(query(url, "SELECT id::text, video_url FROM recap_videos"))
            for url in urls.values()
        ]
        assert videos[0] == videos[1]
        assert len(set(videos[0].values())) == total
        # The callbacks eu received during its tail reach us with eu's raw events, and can
        # be handled before the payments they follow: retried until the payment is, never
        # dead (outbox.errors.RenderCallbackBeforePayment).
        dead_callbacks = Counter(
            "tail" if recap_id in tail else "other"
            for (recap_id,) in query(
                urls["us"],
                "SELECT convert_from(r.body, 'UTF8')::jsonb -> 'data' ->> 'recap_id' "
                "FROM ingress_delivery d JOIN ingress_rawevent r ON r.id = d.raw_event_id "
                "WHERE d.handler LIKE %s AND d.status = 'dead'",
                ("%record_render_result",),
            )
        )
        assert not dead_callbacks, dict(dead_callbacks)
        print(output)
        print(
            f"\noutbox melt: {total} paid recaps ({RECAPS_TAIL} in eu's tail), {stats['accepted']} "
            f"renders accepted, {len(retried)} keys posted again and recognised; render callbacks "
            f"dead in us: {dict(dead_callbacks)}"
        )
    finally:
        for process in fleet.values():
            process.stop(grace=5)
