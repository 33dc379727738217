"""The inbox's claims of raw events on the one queue (kernel/queue.py) as a state machine:
workers claim batches, settle them, give them back, die, freeze and resume; time passes;
orphans are re-armed — in any interleaving, checked by hypothesis against a model.

Invariants after every step:
- no event settled twice (its verify_count), none lost (each pending or settled);
- a settled event keeps no claim, a processing claim names its time and holder;
- `worker_died` only after INBOX_MAX_WORKER_DEATHS deaths;
- a claim whose holder lives is never taken from it.
"""

import re
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from ingress import inbox
from ingress.inbox import ClaimedBatch, raw_event_claims_rearm_orphaned, raw_events_claim
from ingress.models import DedupKey, Delivery, RawEvent, RawEventClaim
from kernel.queue import Holder
from tests.ingress.test_inbox import receive_github

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

ROWS = 6
TTL_SECONDS = 45
LEASE_SECONDS = 3600  # the backstop
MAX_DEATHS = 3


@dataclass
class Worker:
    holder: Holder
    batches: list[ClaimedBatch] = field(default_factory=list)


class InboxClaims(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        for model in (Delivery, DedupKey, RawEventClaim, RawEvent):
            model.objects.all().delete()
        client = Client()
        self.ids = [
            receive_github(client, delivery=f"p-{n}-{timezone.now().timestamp()}").id
            for n in range(ROWS)
        ]
        # Simulated time well after the server started (the holder check waits that long).
        self.now = timezone.now() + timedelta(hours=1)
        self.workers = [
            Worker(Holder.new(region=0)),
            Worker(Holder.new(region=0)),
            Worker(Holder.new(region=1)),  # another region's: its claims are taken back
        ]
        self.abandoned: list[ClaimedBatch] = []  # batches of workers that died

    def still_its_own(self, batch: ClaimedBatch) -> set[int]:
        rows = RawEventClaim.objects.filter(raw_event_id__in=batch.ids, status="processing")
        fences = {(c.id, c.attempts, c.claimed_at, c.holder) for c in batch.claims}
        return {
            row.raw_event_id
            for row in rows
            if (row.raw_event_id, row.attempts, row.claimed_at, row.claimed_by) in fences
        }

    @rule(worker=st.integers(0, 2), limit=st.integers(1, 4))
    def claim(self, worker: int, limit: int) -> None:
        w = self.workers[worker]
        batch = raw_events_claim(limit=limit, now=self.now, holder=w.holder)
        if batch is not None:
            w.batches.append(batch)

    @rule(worker=st.integers(0, 2), data=st.data())
    def settle(self, worker: int, data: st.DataObject) -> None:
        w = self.workers[worker]
        if w.batches:
            batch = w.batches.pop(data.draw(st.integers(0, len(w.batches) - 1)))
            self.settle_fenced(batch)

    def settle_fenced(self, batch: ClaimedBatch) -> None:
        own = self.still_its_own(batch)
        inbox._settle_claim(batch, self.now, run_handlers=False)
        settled = set(
            RawEvent.objects.filter(id__in=batch.ids)
            .exclude(signature_status="pending")
            .values_list("id", flat=True)
        )
        assert own <= settled  # every row still its own is settled
        assert not RawEventClaim.objects.filter(raw_event_id__in=own).exists()

    @rule(worker=st.integers(0, 2))
    def give_back(self, worker: int) -> None:
        w = self.workers[worker]
        RawEventClaim.objects.give_back(
            [claim for batch in w.batches for claim in batch.claims], now=self.now
        )
        w.batches = []

    @rule(worker=st.integers(0, 2))
    def die(self, worker: int) -> None:
        """SIGKILL: its claims are abandoned where they are; a new process takes its place."""
        w = self.workers[worker]
        self.abandoned += w.batches
        self.workers[worker] = Worker(Holder.new(region=w.holder.region))

    @rule(data=st.data())
    def a_frozen_worker_resumes(self, data: st.DataObject) -> None:
        """A worker taken for dead comes back and settles its batch: fenced, only the rows
        still its own are written."""
        if self.abandoned:
            batch = self.abandoned.pop(data.draw(st.integers(0, len(self.abandoned) - 1)))
            self.settle_fenced(batch)

    @rule(seconds=st.sampled_from([1, 10, 30, 60, 200]))
    def time_passes(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)
        for w in self.workers:  # live workers beat while they wait
            if w.batches:
                w.holder.beat(now=self.now)

    @rule()
    def rearm_orphaned(self) -> None:
        backstop = self.now - timedelta(seconds=LEASE_SECONDS)
        held = {
            claim.id
            for w in self.workers
            if w.holder.region == 0
            for batch in w.batches
            for claim in batch.claims
            if claim.claimed_at >= backstop
        }
        before = {
            row.raw_event_id: row.claimed_by
            for row in RawEventClaim.objects.filter(status="processing")
        }
        raw_event_claims_rearm_orphaned(now=self.now)
        taken = set(before) - set(
            RawEventClaim.objects.filter(status="processing").values_list(
                "raw_event_id", flat=True
            )
        )
        # A claim whose holder lives (and beats) is never taken from it.
        assert not held & taken

    @invariant()
    def nothing_twice_nothing_lost(self) -> None:
        events = {e.id: e for e in RawEvent.objects.filter(id__in=self.ids)}
        assert set(events) == set(self.ids)
        claims = {c.raw_event_id: c for c in RawEventClaim.objects.all()}
        for event in events.values():
            assert event.verify_count <= (0 if event.signature_status == "pending" else 1)
            if event.signature_status != "pending":
                assert event.id not in claims
            if event.rejection_reason == "worker_died":
                died = re.search(r"died (\d+) times", event.processing_error)
                assert died and int(died.group(1)) >= MAX_DEATHS
        for claim in claims.values():
            assert claim.status in {"pending", "processing"}
            if claim.status == "processing":
                assert claim.claimed_at is not None and claim.claimed_by is not None


def test_any_interleaving_keeps_the_inbox_claims_whole(settings):
    settings.CLAIM_HOLDER_TTL_SECONDS = TTL_SECONDS
    settings.EVENTDROP_REGION_NUMBER = 0
    settings.INBOX_CLAIM_LEASE_SECONDS = LEASE_SECONDS
    settings.INBOX_MAX_WORKER_DEATHS = MAX_DEATHS
    run_state_machine_as_test(
        InboxClaims,
        settings=hypothesis_settings(
            max_examples=20,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
