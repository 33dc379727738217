"""A region joins one that has history — the common way from one region to two — on real
processes and two throw-away clusters (docs/multi-region.md, "Joining a region that has
history").

eu has been the only region for a while: 100,000 webhooks received, verified, deduplicated and
handled (their rows written in SQL, as months of traffic leave them, before regions were
configured). Then eu and us are set up as regions: us's subscription copies eu's raw events and
state as its base copy; eu's subscription to us copies us's raw events, decisions and region
row only, never us's copy of eu's own state back over it. Afterwards us holds every row, both
apply workers run without an error, and new events sent to either region are handled once.
"""

import contextlib
import time
from pathlib import Path

import pytest

from tests.regions.support import (
    execute,
    handler_runs,
    post,
    query,
    region_setup,
    scalar,
    two_databases,
)
from tests.support.processes import Managed, free_port, start_procfile, wait_until

pytestmark = pytest.mark.faults

HISTORY = 100_000
NEW = 40  # sent after the join, half to each region
_HISTORY = """
INSERT INTO ingress_rawevent (source, provider, method, path, query_string, headers, body,
  body_sha256, received_at, delivery_id, signature_status, rejection_reason, verify_count,
  event_type, provider_retry_reason, dedup_key, dispatch_status, verified_at, handled_at)
SELECT 'stripe', 'stripe', 'POST', '/webhooks/stripe/', '', '{}'::jsonb,
  convert_to('{"id": "evt_history_' || n || '"}', 'UTF8'), md5(n::text),
  now() - n * interval '20 ms', '', 'verified', '', 1, 'payment_intent.succeeded', '',
  'evt_history_' || n, 'dispatched', now(), now()
FROM generate_series(1, %(rows)s) AS n;
INSERT INTO ingress_dedupkey (source, key, raw_event_id, created_at)
  SELECT 'stripe', dedup_key, id, now() FROM ingress_rawevent;
INSERT INTO ingress_delivery (raw_event_id, handler, status, attempts, total_attempts,
  next_attempt_at, last_error, created_at, finished_at, ordering_key, forced, worker_deaths)
  SELECT id, 'bench.handlers.count_bench_delivery_0', 'done', 1, 1, now(), '', now(), now(),
  '', false, 0 FROM ingress_rawevent;
"""


def synchronised(url: str) -> bool:
    """Every table of the region's subscriptions copied and streaming ('r')."""
    return not scalar(url, "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'")


def counts(url: str) -> tuple[int, ...]:
    return tuple(
        scalar(url, f"SELECT count(*) FROM {table}")  # noqa: S608 (constant names)
        for table in ("ingress_rawevent", "ingress_dedupkey", "ingress_delivery")
    )


def apply_errors(url: str) -> int:
    return scalar(url, "SELECT coalesce(sum(apply_error_count), 0) FROM pg_stat_subscription_stats")


def test_a_region_joins_one_with_a_hundred_thousand_events_and_both_work_on(tmp_path: Path):
    with two_databases() as regions:
        urls, envs = regions.urls, regions.envs
        execute(urls["eu"], _HISTORY % {"rows": HISTORY})
        assert counts(urls["eu"]) == (HISTORY, HISTORY, HISTORY)

        started = time.monotonic()
        with contextlib.suppress(RuntimeError):  # us has no publications yet
            region_setup(envs["eu"], "--processing-region", "eu")
        region_setup(envs["us"])  # the base copy: eu's raw events and state
        output = region_setup(envs["eu"])
        assert "only the peer's raw events, decisions and region row were copied" in output
        wait_until(
            lambda: (
                synchronised(urls["us"])
                and synchronised(urls["eu"])
                and counts(urls["us"]) == counts(urls["eu"])
            ),
            "us holding eu's history",
            lambda: (counts(urls["us"]), counts(urls["eu"])),
            [],
            timeout=300,
        )
        copied = time.monotonic() - started
        print(f"\nbase copy of {HISTORY} events, their dedup keys and deliveries: {copied:.1f} s")

        ports = {"eu": free_port(), "us": free_port()}
        fleet: list[Managed] = []
        try:
            for region in ("eu", "us"):
                log = tmp_path / f"{region}.log"
                fleet.append(start_procfile("web", envs[region], port=ports[region], log=log))
                log = tmp_path / f"inbox-{region}.log"
                fleet.append(start_procfile("inbox", envs[region], log=log))
            for region in ("eu", "us"):
                fleet[0 if region == "eu" else 2].wait_listening(ports[region], timeout=60)
            for n in range(NEW):
                assert post(ports["eu" if n % 2 else "us"], f"evt_joined_{n}") == 202
            wait_until(
                lambda: (
                    sum(1 for key in handler_runs(urls["eu"]) if key.startswith("evt_joined"))
                    == NEW
                ),
                "every new event handled in eu, the processing region",
                lambda: handler_runs(urls["eu"]),
                fleet,
                timeout=120,
            )
            runs = handler_runs(urls["eu"])
            assert all(runs[f"evt_joined_{n}"] == 1 for n in range(NEW))
            assert not handler_runs(urls["us"])  # the standby handles nothing
            # Both ways: us sees the new events' state, eu sees the events us received.
            wait_until(
                lambda: counts(urls["us"]) == counts(urls["eu"]),
                "the new state replicated to us",
                lambda: (counts(urls["us"]), counts(urls["eu"])),
                fleet,
                timeout=60,
            )
            assert counts(urls["eu"]) == (HISTORY + NEW,) * 3
            in_eu = query(urls["eu"], "SELECT count(*) FROM ingress_rawevent WHERE region = 'us'")
            assert in_eu[0][0] == NEW // 2
            assert apply_errors(urls["eu"]) == apply_errors(urls["us"]) == 0
        finally:
            for process in fleet:
                process.stop(grace=5)
