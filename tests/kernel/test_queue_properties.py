"""The one queue (kernel/queue.py) as a state machine: workers claim, succeed, fail
(transient, permanent, deferred), die, give back; time passes; orphans are re-armed; an
operator re-arms the dead — in any interleaving, checked by hypothesis against a model.

Invariants after every step:
- never two successes for one claim, nor two for one arming of a row;
- no terminal state without a verdict (a permanent failure, or deaths with the row alone)
  or N charged attempts and the horizon;
- no row lost: every row is in one state, a processing row has a live or abandoned claim;
- a claim whose holder lives is never taken from it.
"""

from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from ingress.models import Delivery
from kernel.errors import Disposition
from kernel.queue import Claim, Holder
from kernel.retry import Action, Failure, RetryPolicy, RetryStrategy

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # about 20 s

ROWS = 6
MAX_ATTEMPTS = 3
HORIZON = timedelta(seconds=120)
TTL_SECONDS = 45
BACKSTOP_SECONDS = 3600
MAX_DEATHS = 3
STRATEGY = RetryStrategy(
    policy=RetryPolicy(max_attempts=MAX_ATTEMPTS, base_seconds=1.0, cap_seconds=8.0),
    horizon_seconds=HORIZON.total_seconds(),
)
FAILURES = {
    "transient": Failure(Disposition.TRANSIENT, "unclassified:KeyError"),
    "permanent": Failure(Disposition.PERMANENT, "permanent"),
    "deferred": Failure(Disposition.DEFERRED, "database:OperationalError"),
}


@dataclass
class Worker:
    holder: Holder
    claims: list[Claim] = field(default_factory=list)
    alive: bool = True


class OneQueue(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        Delivery.objects.all().delete()
        # Simulated time well after the server started (the holder check waits that long).
        self.now = timezone.now() + timedelta(hours=1)
        rows = Delivery.objects.bulk_create(
            Delivery(raw_event_id=n, handler="property.handler", next_attempt_at=self.now)
            for n in range(1, ROWS + 1)
        )
        self.ids = [row.id for row in rows]
        self.workers = [
            Worker(Holder.new(region=0)),
            Worker(Holder.new(region=0)),
            Worker(Holder.new(region=1)),  # another region's: its claims are taken back
        ]
        self.successes: dict[int, int] = dict.fromkeys(self.ids, 0)  # since last armed
        self.verdicts: set[int] = set()  # rows a permanent failure was recorded for
        self.abandoned: list[Claim] = []  # claims of workers that died

    def queue(self):  # the manager, typed as the one queue
        return Delivery.objects

    @rule(worker=st.integers(0, 2), limit=st.integers(1, 4))
    def claim(self, worker: int, limit: int) -> None:
        w = self.workers[worker]
        if not w.alive:
            return
        w.claims += self.queue().claim(
            limit=limit, now=self.now, eligible="ordering_key = ''", holder=w.holder
        )

    @rule(worker=st.integers(0, 2), data=st.data())
    def succeed(self, worker: int, data: st.DataObject) -> None:
        w = self.workers[worker]
        if not w.claims:
            return
        claim = w.claims.pop(data.draw(st.integers(0, len(w.claims) - 1)))
        if self.queue().complete([claim], now=self.now):
            self.successes[claim.id] += 1

    @rule(worker=st.integers(0, 2), kind=st.sampled_from(sorted(FAILURES)), data=st.data())
    def fail(self, worker: int, kind: str, data: st.DataObject) -> None:
        w = self.workers[worker]
        if not w.claims:
            return
        claim = w.claims.pop(data.draw(st.integers(0, len(w.claims) - 1)))
        decision = STRATEGY.decide(
            FAILURES[kind],
            attempts=claim.attempts,
            now=self.now,
            first_failed_at=claim.first_failed_at,
            waiting_since=claim.waiting_since,
        )
        recorded = self.queue().record(claim, decision, error=kind, now=self.now)
        if recorded and decision.action == Action.GIVE_UP and kind == "permanent":
            self.verdicts.add(claim.id)

    @rule(worker=st.integers(0, 2))
    def give_back(self, worker: int) -> None:
        w = self.workers[worker]
        self.queue().give_back(w.claims, now=self.now)
        w.claims = []

    @rule(worker=st.integers(0, 2))
    def die(self, worker: int) -> None:
        """SIGKILL: its claims are abandoned where they are; a new process takes its place."""
        w = self.workers[worker]
        self.abandoned += w.claims
        self.workers[worker] = Worker(Holder.new(region=w.holder.region))

    @rule(data=st.data(), succeeds=st.booleans())
    def a_frozen_worker_resumes(self, data: st.DataObject, succeeds: bool) -> None:
        """A worker taken for dead (SIGSTOP, a lost network) comes back and records its
        outcome: fenced, it changes nothing once its row was re-armed."""
        if not self.abandoned:
            return
        claim = self.abandoned.pop(data.draw(st.integers(0, len(self.abandoned) - 1)))
        row = Delivery.objects.get(id=claim.id)
        # Its holder too: another worker may have claimed the row again at the same instant
        # with the same attempts (two processes' clocks agree).
        still_its_own = (row.status, row.claimed_at, row.attempts, row.claimed_by) == (
            "processing",
            claim.claimed_at,
            claim.attempts,
            claim.holder,
        )
        if succeeds:
            written = self.queue().complete([claim], now=self.now)
            self.successes[claim.id] += written
        else:
            decision = STRATEGY.decide(FAILURES["permanent"], attempts=claim.attempts, now=self.now)
            written = self.queue().record(claim, decision, error="late", now=self.now)
            if written:
                self.verdicts.add(claim.id)
        assert written == still_its_own  # the fence

    @rule(worker=st.integers(0, 2))
    def beat(self, worker: int) -> None:
        self.workers[worker].holder.beat(now=self.now)

    @rule(seconds=st.sampled_from([1, 10, 30, 60, 200]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)
        for w in self.workers:  # live workers beat while they wait
            if w.claims:
                w.holder.beat(now=self.now)

    @rule()
    def rearm_orphaned(self) -> None:
        # (Past the backstop a claim is taken whoever holds it: a live batch's rows are
        # locked then, and skipped, which this model leaves out.)
        backstop = self.now - timedelta(seconds=BACKSTOP_SECONDS)
        held = {
            c.id
            for w in self.workers
            if w.holder.region == 0
            for c in w.claims
            if c.claimed_at >= backstop
        }
        orphans = self.queue().rearm_orphaned(
            now=self.now,
            backstop_seconds=BACKSTOP_SECONDS,
            max_deaths=MAX_DEATHS,
            error="worker_died: %s deaths",
        )
        # A claim whose holder lives (and beats) is never taken from it.
        assert not held & {orphan.id for orphan in orphans}

    @rule(data=st.data())
    def operator_rearms_the_dead(self, data: st.DataObject) -> None:
        dead = list(Delivery.objects.filter(status="dead").values_list("id", flat=True))
        if not dead:
            return
        row = data.draw(st.sampled_from(dead))
        Delivery.objects.filter(id=row, status="dead").update(
            status="pending",
            attempts=0,
            worker_deaths=0,
            claimed_at=None,
            claimed_by=None,
            finished_at=None,
            first_failed_at=None,
            waiting_since=None,
            next_attempt_at=self.now,
        )
        self.successes[row] = 0
        self.verdicts.discard(row)

    @invariant()
    def nothing_twice_nothing_lost_nothing_falsely_final(self) -> None:
        assert all(count <= 1 for count in self.successes.values()), self.successes
        rows = {row.id: row for row in Delivery.objects.filter(id__in=self.ids)}
        assert set(rows) == set(self.ids)
        for row in rows.values():
            assert row.status in {"pending", "processing", "done", "dead"}
            if row.status == "processing":
                assert row.claimed_at is not None and row.claimed_by is not None
            if row.status == "done":
                assert self.successes[row.id] == 1
            if row.status == "dead":
                first = row.first_failed_at
                by_horizon = (
                    row.attempts >= MAX_ATTEMPTS
                    and first is not None
                    and self.now >= first + HORIZON
                )
                assert row.id in self.verdicts or row.worker_deaths >= MAX_DEATHS or by_horizon, (
                    row.id,
                    row.attempts,
                    row.worker_deaths,
                    row.last_error,
                )


def test_any_interleaving_keeps_the_queue_whole(settings):
    settings.CLAIM_HOLDER_TTL_SECONDS = TTL_SECONDS
    settings.EVENTDROP_REGION_NUMBER = 0
    run_state_machine_as_test(
        OneQueue,
        settings=hypothesis_settings(
            max_examples=30,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_a_late_outcome_is_fenced_off_a_reclaim_at_the_same_instant(settings):
    """What the state machine found: a row claimed by another region's worker, re-armed,
    and claimed again at the same instant with the same attempts. The first claim's late
    outcome, success or failure, must not touch the second: the fence names the holder."""
    settings.CLAIM_HOLDER_TTL_SECONDS = TTL_SECONDS
    settings.EVENTDROP_REGION_NUMBER = 0
    now = timezone.now() + timedelta(hours=1)
    Delivery.objects.create(raw_event_id=1, handler="property.handler", next_attempt_at=now)
    lost, here = Holder.new(region=1), Holder.new(region=0)
    queue = Delivery.objects
    [first] = queue.claim(limit=1, now=now, eligible="ordering_key = ''", holder=lost)
    queue.rearm_orphaned(
        now=now, backstop_seconds=BACKSTOP_SECONDS, max_deaths=MAX_DEATHS, error="worker_died"
    )
    [second] = queue.claim(limit=1, now=now, eligible="ordering_key = ''", holder=here)
    assert (first.claimed_at, first.attempts) == (second.claimed_at, second.attempts)

    decision = STRATEGY.decide(FAILURES["permanent"], attempts=first.attempts, now=now)
    assert not queue.record(first, decision, error="late", now=now)
    assert not queue.complete([first], now=now)
    queue.give_back([first], now=now)
    row = Delivery.objects.get()
    assert (row.status, row.claimed_by) == ("processing", here.id)
    assert queue.complete([second], now=now) == 1
