"""A claim lives as long as its holder (docs/queue.md), on real processes.

- An inbox worker SIGKILLed mid-batch (the OOM killer, a lost node, a deploy's kill after its
  grace period), a new worker started at once: the dead worker's deliveries are worked again
  within a minute — the holder's TTL, not DELIVERY_STALE_AFTER_SECONDS (2.5 hours) — once
  each.
- A worker frozen mid-batch (SIGSTOP) past its holder's TTL, a second worker running beside
  it: the frozen batch's locks last until the server cancels its statement, then the second
  takes the claims over and runs them; the first, thawed, is fenced out of every one: each
  runs once.

The batch is held at a gate: its handler waits at an advisory lock the test holds, so the
kill and the freeze land inside the batch for certain (tests/ingress/worker_killer).
"""

import contextlib
import os
import signal
import time

import psycopg
import pytest

from ingress.models import Delivery, DeliveryAttempt
from kernel.models import ClaimHolder
from tests.ingress.worker_killer.marks import GATE_LOCK, GATED
from tests.support.processes import app_env, manage, settings_database_url, start_manage, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Stored and verified by the handlers' own settings, so that each gated event has its
# delivery `pending` (verified without running handlers at settle).
_STORE_AND_VERIFY = """
from ingress.inbox import raw_events_verify_batch
from tests.support.signing import store_signed_stripe_event, stripe_event
for n in range({n}):
    store_signed_stripe_event(stripe_event(f"evt_claims_{{n}}", "{event_type}"))
while raw_events_verify_batch():
    pass
"""
_WAITING_AT_THE_GATE = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"  # noqa: S608 (a constant)
    f" AND objid = {GATE_LOCK}"
)


def worker_env(**extra: str) -> dict[str, str]:
    return app_env(
        settings_database_url(),
        DJANGO_SETTINGS_MODULE="tests.ingress.worker_killer.settings",
        INBOX_IDLE_SLEEP_SECONDS="0.1",
        LOG_LEVEL="WARNING",
        **extra,
    )


@contextlib.contextmanager
def gate():
    """Held by the test: every gated handler waits here until the `with` ends."""
    with psycopg.connect(settings_database_url(), autocommit=True) as held:
        held.execute("SELECT pg_advisory_lock(%s)", [GATE_LOCK])
        yield


def at_the_gate() -> bool:
    with psycopg.connect(settings_database_url(), autocommit=True) as probe:
        row = probe.execute(_WAITING_AT_THE_GATE).fetchone()
    return row is not None and row[0] > 0


def counts() -> dict[str, int]:
    return {
        status: Delivery.objects.filter(status=status).count()
        for status in ("pending", "processing", "done", "dead")
    }


def done_once_each(rows: int) -> None:
    assert counts() == {"pending": 0, "processing": 0, "done": rows, "dead": 0}
    for delivery in Delivery.objects.all():
        outcomes = list(delivery.history.values_list("outcome", flat=True))
        assert outcomes == [DeliveryAttempt.Outcome.DONE], (delivery.id, outcomes)


def test_a_killed_workers_deliveries_are_worked_again_within_a_minute_once_each(tmp_path):
    # The 500 claimed deliveries with CLAIMS_OF_THE_DEAD_ROWS=500 (docs/queue.md).
    rows = int(os.environ.get("CLAIMS_OF_THE_DEAD_ROWS", "300"))
    env = worker_env()  # the production defaults: CLAIM_HOLDER_TTL_SECONDS 45
    manage("shell", "-c", _STORE_AND_VERIFY.format(n=rows, event_type=GATED), env=env)
    assert counts()["pending"] == rows

    first = second = None
    try:
        with gate():
            first = start_manage(["process_inbox"], env, log=tmp_path / "first.log")
            wait_until(
                lambda: counts()["processing"] == rows and at_the_gate(),
                "the batch claimed and at the gate",
                counts,
                [first],
            )
            [holder] = set(Delivery.objects.values_list("claimed_by", flat=True))
            first.kill()  # SIGKILL mid-batch: its claims stay `processing`
            killed_at = time.monotonic()
            second = start_manage(["process_inbox"], env, log=tmp_path / "second.log")
        wait_until(
            lambda: not Delivery.objects.filter(claimed_by=holder).exists(),
            "the dead holder's claims taken over",
            counts,
            [second],
        )
        taken_over = time.monotonic() - killed_at
        wait_until(lambda: counts()["done"] == rows, "every delivery done", counts, [second])
        done = time.monotonic() - killed_at
    finally:
        for process in (first, second):
            if process is not None:
                process.stop()
    print(f"{rows} claims of a SIGKILLed worker taken over {taken_over:.1f} s, done {done:.1f} s")
    # The mechanism is timed (the holder's TTL, 45 s, and a pass), not how fast this machine
    # then runs the batch: under CI's load that alone has taken 40 s.
    assert taken_over < 60, taken_over
    done_once_each(rows)
    # The re-arm gave each claim's attempt back and counted the death, ended by the success.
    assert set(Delivery.objects.values_list("attempts", "worker_deaths")) == {(1, 0)}


def test_a_frozen_workers_claims_are_fenced_when_taken_over(tmp_path):
    """Frozen (SIGSTOP) mid-batch past its holder's TTL: a batch's row locks last only as
    long as its statement (the server cancels a frozen one at statement_timeout, 15 s, and
    the aborted transaction holds no lock), so the second worker takes the claims over and
    runs them; the first, thawed, finds every claim fenced and runs none: once each."""
    rows = 50
    ttl = 36  # the shortest kernel.E001 allows, to keep the test short
    env = worker_env(CLAIM_HOLDER_TTL_SECONDS=str(ttl))
    manage("shell", "-c", _STORE_AND_VERIFY.format(n=rows, event_type=GATED), env=env)

    first = second = None
    frozen = False
    try:
        with gate():
            first = start_manage(["process_inbox"], env, log=tmp_path / "first.log")
            wait_until(
                lambda: counts()["processing"] == rows and at_the_gate(),
                "the batch claimed and at the gate",
                counts,
                [first],
            )
            [holder] = set(Delivery.objects.values_list("claimed_by", flat=True))
            assert holder is not None
            os.killpg(first.pid, signal.SIGSTOP)
            frozen = True
            second = start_manage(["process_inbox"], env, log=tmp_path / "second.log")
            wait_until(
                lambda: not Delivery.objects.filter(claimed_by=holder).exists(),
                "the frozen holder's claims taken over",
                counts,
                [second],
            )
            beat = ClaimHolder.objects.get(id=holder).beat_at
            assert time.time() - beat.timestamp() > ttl  # taken for gone by its beat alone
            os.killpg(first.pid, signal.SIGCONT)
            frozen = False
        wait_until(lambda: counts()["done"] == rows, "every delivery done", counts, [first, second])
    finally:
        if frozen and first is not None:
            os.killpg(first.pid, signal.SIGCONT)
        for process in (first, second):
            if process is not None:
                process.stop()
    done_once_each(rows)
    assert "ingress.deliver.lost_claim" in first.output()  # the thawed batch, fenced out
