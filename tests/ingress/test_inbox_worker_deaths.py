"""Issue 29 on real processes: no row can take the inbox worker down for good.

- 600 junk bodies of 1 MiB, each with a Stripe signature header (`t=1,v1=00`: anyone can
  send that, and the receive path stores it), ahead of a real signed checkout, then
  `process_inbox` under a 1 GiB address-space limit (`prlimit --as`; `systemd-run --scope`
  needs a systemd this machine does not run): it drains the junk (rejected) and handles the
  checkout behind it, and its peak resident set is printed. Before the claim stopped at
  INBOX_BATCH_BYTES, every pass failed with "out of memory for query result" and the
  checkout stayed pending (docs/benchmarks.md). The junk is stored through the receive
  path's own service (`raw_event_store`), not POSTed: 600 MiB through the web server would
  test the web server, whose memory bound has tests of its own (tests/faults/).
- A settle step and a handler that SIGKILL their own worker (tests/ingress/worker_killer,
  installed only in these processes' settings), run by a supervisor that restarts the
  worker each time it dies, as systemd or Kubernetes would: after INBOX_MAX_WORKER_DEATHS
  deaths the row is set aside `worker_died` (the raw event rejected, the delivery dead), and
  every other event is handled. Exactly that many deaths, no more.

Driven by what the processes did (rows settled, the worker's exit), never by the clock; the
short lease and stale threshold only make the dead worker's rows due again sooner.
"""

import contextlib
import os
import signal
import time
from collections.abc import Callable

import psycopg
import pytest
from django.db.models import Q

from ingress.models import Delivery, RawEvent, RawEventClaim
from ingress.services import raw_event_store
from ingress.sources import all_sources
from recaps.models import RecapStatus, RecapVideo
from tests.ingress.worker_killer.marks import (
    GATE_LOCK,
    GATED,
    KILL_IN_HANDLER,
    KILL_IN_SETTLE_MARK,
    ORDINARY,
)
from tests.recaps.factories import EventFactory, RecapFactory
from tests.support.processes import (
    PYTHON,
    Managed,
    PeakRSS,
    app_env,
    settings_database_url,
    start_manage,
    wait_until,
)
from tests.support.signing import checkout_session_event, store_signed_stripe_event, stripe_event

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MIB = 1024 * 1024
DEATHS = 3  # INBOX_MAX_WORKER_DEATHS in these tests' workers


def killer_env(**extra: str) -> dict[str, str]:
    return app_env(
        settings_database_url(),
        DJANGO_SETTINGS_MODULE="tests.ingress.worker_killer.settings",
        INBOX_MAX_WORKER_DEATHS=str(DEATHS),
        INBOX_CLAIM_LEASE_SECONDS="0.5",
        DELIVERY_STALE_AFTER_SECONDS="1",
        INBOX_IDLE_SLEEP_SECONDS="0.1",
        LOG_LEVEL="WARNING",
        **extra,
    )


def supervise(env: dict[str, str], log_dir, done: Callable[[], bool], saw, max_deaths: int) -> int:
    """Run `process_inbox` until `done`, restarting it each time it dies as a supervisor
    would; returns how many times it died (each must be a SIGKILL of its own)."""
    deaths = 0
    worker = start_manage(["process_inbox"], env, log=log_dir / "inbox-0.log")
    deadline = time.monotonic() + 120
    try:
        while not done():
            if not worker.alive:
                assert worker.process.returncode == -signal.SIGKILL, worker.output()[-3000:]
                worker.stop()  # its log closed
                deaths += 1
                assert deaths <= max_deaths, f"died {deaths} times; saw {saw()}"
                worker = start_manage(["process_inbox"], env, log=log_dir / f"inbox-{deaths}.log")
            assert time.monotonic() < deadline, f"timed out; {deaths} deaths; saw {saw()}"
            time.sleep(0.1)
    finally:
        worker.stop()
    return deaths


def stripe_events(prefix: str, count: int) -> list[RawEvent]:
    return [
        store_signed_stripe_event(stripe_event(f"evt_{prefix}_{n}", ORDINARY)) for n in range(count)
    ]


def states() -> dict[str, object]:
    return {
        "raw": list(
            RawEvent.objects.order_by("id").values_list(
                "id", "signature_status", "rejection_reason", "processing_error"
            )
        ),
        "deliveries": list(
            Delivery.objects.order_by("id").values_list(
                "raw_event_id", "status", "worker_deaths", "attempts"
            )
        ),
    }


def all_handled_but(poison: RawEvent) -> bool:
    others = RawEvent.objects.exclude(id=poison.id)
    return not others.exclude(signature_status="verified", handled_at__isnull=False).exists()


def test_a_settle_step_that_kills_its_worker_is_set_aside_after_n_deaths(tmp_path):
    before = stripe_events("before", 4)
    poison = store_signed_stripe_event(
        stripe_event("evt_poison", ORDINARY, {"note": KILL_IN_SETTLE_MARK.decode()})
    )
    after = stripe_events("after", 4)

    def done() -> bool:
        poison.refresh_from_db()
        return poison.rejection_reason == "worker_died" and all_handled_but(poison)

    deaths = supervise(killer_env(), tmp_path, done, states, max_deaths=DEATHS + 2)

    # The first death took the whole batch; every later one the poison row alone.
    assert deaths == DEATHS
    poison.refresh_from_db()
    assert poison.signature_status == "rejected"
    assert poison.processing_error.startswith(f"worker_died: its worker died {DEATHS} times")
    assert not Delivery.objects.filter(raw_event_id=poison.id).exists()
    assert not RawEventClaim.objects.exists()  # every claim ended with its row
    for event in [*before, *after]:
        event.refresh_from_db()
        assert Delivery.objects.get(raw_event_id=event.id).status == "done"


def test_a_handler_that_kills_its_worker_is_dead_after_n_deaths(tmp_path):
    before = stripe_events("before", 4)
    poison = store_signed_stripe_event(stripe_event("evt_poison", KILL_IN_HANDLER))
    after = stripe_events("after", 4)
    poisoned = Delivery.objects.filter(raw_event_id=poison.id)

    def done() -> bool:
        return (
            poisoned.filter(status="dead").exists()
            and not RawEvent.objects.filter(signature_status="pending").exists()
            and not Delivery.objects.exclude(id__in=poisoned.values("id"))
            .exclude(status="done")
            .exists()
        )

    deaths = supervise(killer_env(), tmp_path, done, states, max_deaths=DEATHS + 3)

    # The first death is its handler run at settle, on the raw event's batch; the event is
    # then settled alone without running handlers, and the next DEATHS deaths are its
    # delivery's, claimed on its own after the first of them.
    assert deaths == DEATHS + 1
    (delivery,) = poisoned
    assert (delivery.status, delivery.worker_deaths, delivery.attempts) == ("dead", DEATHS, 0)
    assert delivery.last_error.startswith(f"worker_died: its worker died {DEATHS} times")
    assert list(delivery.history.values_list("outcome", flat=True)) == ["dead"]
    poison.refresh_from_db()
    assert poison.signature_status == "verified"
    assert poison.handled_at is not None
    for event in [*before, *after]:
        event.refresh_from_db()
        assert Delivery.objects.get(raw_event_id=event.id).status == "done"


def test_a_flood_of_1_mib_junk_drains_under_a_1_gib_memory_limit(tmp_path):
    recap = RecapFactory.create(event=EventFactory.create())
    source = all_sources()["stripe"]
    junk = 600
    for _ in range(junk):
        raw_event_store(
            source=source,
            method="POST",
            path="/webhooks/stripe/",
            query_string="",
            headers={"stripe-signature": "t=1,v1=00", "content-type": "application/json"},
            body=os.urandom(MIB),
            remote_addr="127.0.0.1",
        )
    checkout = store_signed_stripe_event(checkout_session_event(str(recap.id)))
    env = app_env(settings_database_url(), INBOX_IDLE_SLEEP_SECONDS="0.1", LOG_LEVEL="WARNING")
    args = ["prlimit", f"--as={1024 * MIB}", PYTHON, "manage.py", "process_inbox"]
    worker = Managed(args, env, log=tmp_path / "inbox.log")

    def drained() -> bool:
        return (
            not RawEvent.objects.filter(signature_status="pending").exists()
            and RecapVideo.objects.filter(id=recap.id, status=RecapStatus.PAID).exists()
        )

    try:
        with PeakRSS(worker.pid) as rss:
            wait_until(drained, "the junk rejected and the checkout handled", states, [worker])
    finally:
        worker.stop()
    peak = rss.peak.get(worker.pid, 0)
    print(f"process_inbox peak RSS: {peak / MIB:.0f} MiB ({junk} x 1 MiB junk, 1 GiB limit)")
    assert "pass_failed" not in worker.output(), worker.output()[-3000:]
    rejected = RawEvent.objects.filter(~Q(id=checkout.id), signature_status="rejected")
    assert rejected.count() == junk
    checkout.refresh_from_db()
    assert (checkout.signature_status, checkout.dispatch_status) == ("verified", "dispatched")
    assert Delivery.objects.get(raw_event_id=checkout.id).status == "done"
    assert 0 < peak < 1024 * MIB


_STORE = """
from tests.support.signing import store_signed_stripe_event, stripe_event
for n in range({n}):
    store_signed_stripe_event(stripe_event(f"evt_restart_{{n}}", "{event_type}"))
"""
_COUNTS = (
    "SELECT (SELECT count(*) FROM ingress_rawevent WHERE signature_status = 'verified'),"
    " (SELECT count(*) FROM ingress_rawevent WHERE signature_status = 'rejected'),"
    " (SELECT coalesce(max(worker_deaths), 0) FROM ingress_raweventclaim),"
    " (SELECT count(*) FROM ingress_raweventclaim WHERE status = 'processing'),"
    " (SELECT count(*) FROM ingress_delivery WHERE status = 'done'),"
    " (SELECT coalesce(max(worker_deaths), 0) FROM ingress_delivery)"
)
_WAITING_AT_THE_GATE = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"  # noqa: S608 (a constant)
    f" AND objid = {GATE_LOCK}"
)


@pytest.mark.faults
def test_database_restarts_and_a_deploy_count_no_worker_death(tmp_path):
    """PostgreSQL restarted under the worker's batch (cleanly, then a crash) and a deploy's
    SIGTERM mid-batch: the worker lives through each and gives back what it could not settle,
    so no raw event or delivery is ever counted a death — with a lease short enough that a
    claim not given back would have been. Each fault lands inside a batch for certain: the
    batch's handler waits at an advisory lock the test holds (the gate) until the fault."""
    from tests.support.pg_cluster import throwaway_cluster
    from tests.support.processes import manage, migrate

    rows = 100
    with throwaway_cluster(prefix="i29") as cluster:
        cluster.createdb("eventdrop")
        env = app_env(
            cluster.url("eventdrop"),
            DJANGO_SETTINGS_MODULE="tests.ingress.worker_killer.settings",
            INBOX_BATCH_SIZE="5",
            INBOX_CLAIM_LEASE_SECONDS="0.5",
            INBOX_IDLE_SLEEP_SECONDS="0.05",
            LOG_LEVEL="WARNING",
        )
        migrate(env)
        manage("shell", "-c", _STORE.format(n=rows, event_type=GATED), env=env)

        def counts() -> tuple[int, ...]:
            try:
                return tuple(int(n) for n in cluster.psql(_COUNTS, db="eventdrop").split("|"))
            except RuntimeError:  # the cluster is restarting
                return (-1, -1, -1, -1, -1, -1)

        def at_the_gate() -> bool:
            return cluster.psql(_WAITING_AT_THE_GATE, db="eventdrop") == "1"

        def gate() -> psycopg.Connection:
            closed = psycopg.connect(cluster.url("eventdrop"), autocommit=True)
            closed.execute("SELECT pg_advisory_lock(%s)", [GATE_LOCK])
            return closed

        worker = start_manage(["process_inbox"], env, log=tmp_path / "inbox-1.log")
        try:
            for mode in ("fast", "immediate"):  # `immediate` is a crash
                with contextlib.closing(gate()):
                    wait_until(at_the_gate, "a batch at the gate", counts, [worker])
                    cluster.restart(mode)  # the gate's session goes with it
            with gate() as closed:
                wait_until(at_the_gate, "a batch at the gate", counts, [worker])
                worker.process.send_signal(signal.SIGTERM)  # a deploy, mid-batch
                closed.execute("SELECT pg_advisory_unlock(%s)", [GATE_LOCK])
            assert worker.process.wait(timeout=60) == 0  # the pass in hand finished first
        finally:
            worker.stop()
        verified, _, _, claimed, _, _ = counts()
        assert 0 < verified < rows, "the faults must land mid-run"
        assert claimed == 0  # nothing left claimed by the worker that was stopped
        worker = start_manage(["process_inbox"], env, log=tmp_path / "inbox-2.log")
        try:
            wait_until(lambda: counts()[4] == rows, "every delivery done", counts, [worker])
        finally:
            worker.stop()
        assert counts() == (rows, 0, 0, 0, rows, 0), worker.output()[-3000:]
        logs = "".join(path.read_text() for path in sorted(tmp_path.glob("inbox-*.log")))
        # A fault landed under a batch of raw events (the handler ran at settle) and one under
        # a batch of deliveries (the handler, having failed at settle, rests from it for a
        # while: ingress/deliveries/) …
        assert "ingress.verify.claims_given_back" in logs
        assert "ingress.deliver.claims_given_back" in logs
        assert "worker_death_counted" not in logs  # … and no claim was taken for a death
