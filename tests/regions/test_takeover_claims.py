"""A takeover takes back the lost region's claims (docs/queue.md, "A claim lives as long as
its holder"; docs/multi-region.md), on real processes and two throw-away clusters.

eu, the processing region, holds claims that have replicated to us when it melts: a batch of
deliveries whose handler waits at a gate the test holds, and renders its dispatcher is
asking a render service that hangs. us takes over: each of those deliveries and side effects
is done in us within a minute of the takeover, once (the render service us asks sees each
idempotency key once), and nothing is left `processing` — in us, and in eu after its rejoin.
"""

import contextlib
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest
import requests

from tests.ingress.worker_killer.marks import GATE_LOCK, GATED
from tests.regions.support import (
    kill_cluster,
    lease_epoch,
    query,
    region_setup,
    scalar,
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

DELIVERIES, RECAPS = 30, 4  # RENDER_MAX_CONCURRENCY renders in flight at once
# A render the lost region asked for is answered only after the call's deadline, long
# enough for the claim to replicate and the region to melt.
RENDER_SETTINGS = {"RENDER_READ_TIMEOUT_SECONDS": "30", "RENDER_TIMEOUT_SECONDS": "40"}

_BUYER = "from django.contrib.auth.models import User; User.objects.create(username='buyer')"
_GATED_EVENTS = """
from ingress.inbox import raw_events_verify_batch
from tests.support.signing import store_signed_stripe_event, stripe_event
for n in range({n}):
    store_signed_stripe_event(stripe_event(f"evt_takeover_{{n}}", "{event_type}"))
while raw_events_verify_batch():
    pass
"""
_PAID_RECAPS = """
from django.contrib.auth.models import User
from recaps.models import Event, Photo, RecapVideo
from recaps.services import recap_mark_paid
event = Event.objects.create(title="takeover")
for n in range(5):
    Photo.objects.create(event=event, storage_key=f"events/takeover/{{n}}.jpg")
buyer = User.objects.get(username="buyer")
for recap_id in {recap_ids!r}:
    RecapVideo.objects.create(id=recap_id, event=event, buyer=buyer)
    recap_mark_paid(recap_id=recap_id, payment_reference=f"pi_{{recap_id}}")
# A service that rendered a moment ago: the breaker lets every slot call it, not one probe.
from django.utils import timezone
from outbox.breaker import RENDER_SERVICE_BREAKER
from outbox.models import CircuitBreaker
CircuitBreaker.objects.update_or_create(
    name=RENDER_SERVICE_BREAKER, defaults={{"last_success_at": timezone.now()}}
)
"""


def statuses(url: str, table: str) -> Counter:
    return Counter(
        status
        for (status,) in query(url, f"SELECT status FROM {table}")  # noqa: S608 (a name)
    )


def test_the_lost_regions_claims_are_done_in_the_new_region_within_a_minute_once(
    tmp_path: Path,
):
    render = {"eu": free_port(), "us": free_port()}
    recap_ids = [str(uuid.uuid4()) for _ in range(RECAPS)]
    with two_regions(**RENDER_SETTINGS) as pair:
        urls, envs, eu_db = pair.urls, pair.envs, pair.clusters["eu"]
        for region in ("eu", "us"):
            envs[region]["DJANGO_SETTINGS_MODULE"] = "tests.regions.settings_gated"
            envs[region]["RENDER_SERVICE_URL"] = f"http://127.0.0.1:{render[region]}"
            # The buyer of the recaps: users are each region's own (not replicated).
            manage("shell", "-c", _BUYER, env=envs[region])
        fleet: dict[str, Managed] = {}

        def alive() -> list[Managed]:
            return [process for process in fleet.values() if process.alive]

        def start(region: str) -> None:
            for kind in ("inbox", "dispatcher"):
                log = tmp_path / f"{kind}-{region}.log"
                fleet[f"{kind}-{region}"] = start_procfile(kind, envs[region], log=log)

        try:
            for region in ("eu", "us"):
                fleet[f"renderer-{region}"] = start_manage(
                    ["run_fake_renderer", "--port", str(render[region])],
                    envs[region],
                    log=tmp_path / f"renderer-{region}.log",
                )
                fleet[f"renderer-{region}"].wait_listening(render[region], timeout=30)
            # eu's render service accepts, then answers only after eu is gone.
            requests.post(
                f"http://127.0.0.1:{render['eu']}/_control",
                json={"mode": "slow", "delay": 60},
                timeout=5,
            ).raise_for_status()
            with contextlib.closing(psycopg.connect(urls["eu"], autocommit=True)) as gate:
                gate.execute("SELECT pg_advisory_lock(%s)", [GATE_LOCK])
                start("eu")
                start("us")  # idle while eu processes; its heartbeat acknowledges eu
                wait_until(
                    lambda: lease_epoch(urls["eu"], "eu") == 1,
                    "eu processing",
                    lambda: query(urls["eu"], "SELECT * FROM regions_regionstate"),
                    alive(),
                    timeout=60,
                )
                env = envs["eu"]
                manage("shell", "-c", _GATED_EVENTS.format(n=DELIVERIES, event_type=GATED), env=env)
                manage("shell", "-c", _PAID_RECAPS.format(recap_ids=recap_ids), env=env)
                # eu claims them all, and they replicate to us as eu's claims.
                wait_until(
                    lambda: (
                        statuses(urls["us"], "ingress_delivery")["processing"] == DELIVERIES
                        and statuses(urls["us"], "recap_side_effects")["processing"] == RECAPS
                    ),
                    "eu's claims replicated to us",
                    lambda: (
                        statuses(urls["us"], "ingress_delivery"),
                        statuses(urls["us"], "recap_side_effects"),
                    ),
                    alive(),
                    timeout=90,
                )
                kill_cluster(eu_db)
                for kind in ("inbox", "dispatcher"):
                    fleet[f"{kind}-eu"].kill()
            take_over(envs["us"], "us")
            took_over = time.monotonic()

            def done_in_us() -> bool:
                return statuses(urls["us"], "ingress_delivery") == Counter(
                    {"done": DELIVERIES}
                ) and statuses(urls["us"], "recap_side_effects") == Counter({"done": RECAPS})

            wait_until(
                done_in_us,
                "eu's claims done in us",
                lambda: (
                    statuses(urls["us"], "ingress_delivery"),
                    statuses(urls["us"], "recap_side_effects"),
                ),
                alive(),
                timeout=120,
            )
            took = time.monotonic() - took_over
            print(
                f"\neu's {DELIVERIES} deliveries and {RECAPS} renders done in us {took:.1f} s "
                "after the takeover"
            )
            assert took < 60, took
            # Once each: one `done` attempt per delivery in us; one render asked per recap.
            attempts = Counter(
                delivery
                for (delivery,) in query(
                    urls["us"],
                    "SELECT delivery_id FROM ingress_deliveryattempt WHERE outcome = 'done'",
                )
            )
            assert len(attempts) == DELIVERIES and set(attempts.values()) == {1}
            # Taken back from another region's holder: no worker death counted.
            assert scalar(urls["us"], "SELECT max(worker_deaths) FROM ingress_delivery") == 0
            stats = requests.get(f"http://127.0.0.1:{render['us']}/_stats", timeout=5).json()
            assert sorted(stats["posts_by_key"].values()) == [1] * RECAPS, stats

            # eu returns and rejoins: its copy holds no claim of its dead workers either.
            eu_db.start()
            region_setup(envs["eu"], "--rejoin")
            wait_until(
                lambda: (
                    statuses(urls["eu"], "ingress_delivery") == Counter({"done": DELIVERIES})
                    and statuses(urls["eu"], "recap_side_effects") == Counter({"done": RECAPS})
                ),
                "eu's copy done after the rejoin",
                lambda: (
                    statuses(urls["eu"], "ingress_delivery"),
                    statuses(urls["eu"], "recap_side_effects"),
                ),
                alive(),
                timeout=90,
            )
        finally:
            for process in fleet.values():
                process.stop(grace=5)
