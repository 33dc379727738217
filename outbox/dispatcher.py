"""The dispatcher: claims due render rows and asks the render service, within a budget.

One run (`dispatch_run`) has a budget, OUTBOX_DISPATCH_BUDGET_SECONDS (60 s), and keeps
claiming while what is left still covers one worst-case dispatch (kernel/budgets.py): not
one recap per run, as in the seed, but never a dispatch that could outlive the run either.
At most RENDER_MAX_CONCURRENCY render calls are in flight at once (a bulkhead: a slow render
service ties up that many threads and connections, not all of them).

Each row is tried at most once per run, so even a zero-length backoff cannot burn all five
attempts within one run; between runs, the backoff and the circuit breaker spread them out.
Several dispatchers on several hosts can run at once: claims are SELECT … FOR UPDATE SKIP
LOCKED, committed as `processing` before any call, so no row is ever dispatched twice at
the same time.

The circuit breaker (outbox/breaker.py) is consulted through the run's in-process view: no
lock and, while it is closed and clean, no query per row. Whatever goes wrong, including our
own database, a row's outcome is decided by kernel.retry (the finality rule): only a
verdict about the row (422) or N charged failures of its own and the horizon end it; an
answer about the service, its deploy or our database, an ambiguous one, the breaker open or
a missing configuration release it uncharged.
"""

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from kernel import tracing
from kernel.budgets import BudgetClock, render_dispatch_worst_case
from kernel.processing_region import processing_pass
from kernel.queue import this_process
from kernel.retry import classify
from outbox.breaker import RENDER_SERVICE_BREAKER, Breaker, BreakerConfig
from outbox.errors import EventNotFound, RenderCircuitOpen, TooFewPhotos
from outbox.models import AttemptOutcome, BreakerState, RecapSideEffect, SideEffectClaim
from outbox.render_client import RenderClient, RenderClientConfig
from outbox.render_status import RenderCheckReport, render_checks_run
from outbox.services import (
    side_effect_complete,
    side_effect_fail,
    side_effects_claim,
    side_effects_rearm_orphaned,
)
from recaps.models import RecapStatus, RecapVideo
from recaps.selectors import event_photo_keys, photo_keys_by_event, recap_get, recaps_by_id

logger = logging.getLogger(__name__)

# Called as factory(config, clock=clock): the client measures deadlines on the run's clock.
ClientFactory = Callable[..., RenderClient]


# Outcomes of a try the row was not charged for (the finality rule: not about the row).
UNCHARGED_OUTCOMES = (
    AttemptOutcome.SKIPPED,
    AttemptOutcome.SERVICE_UNAVAILABLE,
    AttemptOutcome.AMBIGUOUS,
    AttemptOutcome.DATABASE,
    AttemptOutcome.DEFERRED,
)


@dataclass
class DispatchReport:
    budget_seconds: float
    worst_case_seconds: float
    rearmed_stale: int = 0
    claimed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    breaker: str = BreakerState.CLOSED
    elapsed_seconds: float = 0.0

    def count(self, outcome: str) -> int:
        return self.outcomes.get(outcome, 0)

    def summary(self) -> str:
        waiting = sum(self.count(outcome) for outcome in UNCHARGED_OUTCOMES)
        return (
            f"claimed {self.claimed}: done {self.count(AttemptOutcome.DONE)}, "
            f"retry later {self.count(AttemptOutcome.TRANSIENT)}, "
            f"dead {self.count(AttemptOutcome.DEAD) + self.count(AttemptOutcome.PERMANENT)}, "
            f"released uncharged {waiting} (breaker {self.breaker}), "
            f"errors {self.errors}; re-armed {self.rearmed_stale} stale; "
            f"{self.elapsed_seconds:.1f} s of {self.budget_seconds:.1f} s budget "
            f"(worst-case dispatch {self.worst_case_seconds:.1f} s)"
        )


class _Bulkhead:
    """At most `size` dispatches at once, on threads that live for the whole run.

    Each thread keeps its database connection for the run and closes it when the run ends
    (opening one per dispatch cost more than the dispatch). A bulkhead of one runs inline.
    """

    def __init__(self, size: int):
        self._size = size
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"render-dispatch-{n}", daemon=True)
            for n in range(size if size > 1 else 0)
        ]
        for thread in self._threads:
            thread.start()

    def _serve(self) -> None:
        try:
            while (item := self._work.get()) is not None:
                future, fn, args, kwargs = item
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args, **kwargs))
                    except BaseException as exc:
                        future.set_exception(exc)
        finally:
            connection.close()

    def submit(self, fn, *args, **kwargs) -> Future:
        future: Future = Future()
        if not self._threads:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)
        else:
            self._work.put((future, fn, args, kwargs))
        return future

    def shutdown(self) -> None:
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join()


@dataclass(frozen=True)
class RenderInput:
    """What one dispatch sends, read with the rest of its claimed batch."""

    recap: RecapVideo
    photos: list[str]


def _read_render_inputs(claims: list[SideEffectClaim]) -> dict[int, RenderInput]:
    """The batch's recaps and their events' photos in two queries, not two per row.

    Read right after the claim, so a row claimed ahead may start on a recap up to one
    worst-case dispatch old: a callback that made it `ready` meanwhile is answered from the
    idempotency key (the render already exists) and `recap_mark_rendering` moves only a
    `paid` recap. A read that fails leaves each dispatch to read its own; a missing recap
    is left to the row, which reports it as before.
    """
    if not claims:
        return {}
    try:
        recaps = recaps_by_id(recap_ids=[claim.recap_id for claim in claims])
        photos = photo_keys_by_event(
            event_ids={recap.event_id for recap in recaps.values() if recap.event_id}
        )
    except DatabaseError:
        connection.close_if_unusable_or_obsolete()
        logger.warning("outbox.dispatch.batch_read_failed", extra={"rows": len(claims)})
        return {}
    return {
        claim.id: RenderInput(
            recap=recap,
            photos=photos.get(recap.event_id, []) if recap.event_id is not None else [],
        )
        for claim in claims
        if (recap := recaps.get(claim.recap_id)) is not None
    }


def dispatch_one(
    claim: SideEffectClaim,
    *,
    deadline: float,
    breaker: Breaker,
    now: Callable[[], datetime] = timezone.now,
    client_factory: ClientFactory = RenderClient,
    clock: Callable[[], float] = time.monotonic,
    render_input: RenderInput | None = None,
) -> str:
    """Dispatch one claimed row and record its outcome. Returns the AttemptOutcome.

    `render_input`: the recap and photos as read for the claimed batch (else read here).
    Each attempt is a span under the row's stored context (the paid recap's span), so an
    attempt after a restart or a re-arm joins the recap's trace (kernel/tracing.py)."""
    with tracing.span(
        "render dispatch",
        parent=claim.traceparent,
        attributes={
            "eventdrop.recap_id": str(claim.recap_id),
            "eventdrop.side_effect_id": claim.id,
            "eventdrop.attempt": claim.attempts,
        },
    ) as span:
        outcome = _dispatch(
            claim,
            deadline=deadline,
            breaker=breaker,
            now=now,
            client_factory=client_factory,
            clock=clock,
            render_input=render_input,
        )
        span.set_attribute("eventdrop.outcome", outcome)
        return outcome


def _dispatch(
    claim: SideEffectClaim,
    *,
    deadline: float,
    breaker: Breaker,
    now: Callable[[], datetime],
    client_factory: ClientFactory,
    clock: Callable[[], float],
    render_input: RenderInput | None,
) -> str:
    started_at = now()
    config = RenderClientConfig.from_settings()
    admission = None
    called = False
    try:
        recap = render_input.recap if render_input else recap_get(recap_id=claim.recap_id)
        if recap.status == RecapStatus.READY:
            # A callback got here first (e.g. after an ambiguous timeout): nothing to ask.
            return side_effect_complete(
                claim=claim, render_id=recap.render_id, started_at=started_at, now=now()
            )
        config.require_configured()
        if recap.event is None:
            raise EventNotFound()
        photos = render_input.photos if render_input else event_photo_keys(event=recap.event)
        if len(photos) < settings.RECAP_MIN_PHOTOS:
            raise TooFewPhotos(count=len(photos), minimum=settings.RECAP_MIN_PHOTOS)
        admission = breaker.admit(now=now())
        if not admission.allowed:
            until = admission.retry_at.isoformat() if admission.retry_at else "later"
            raise RenderCircuitOpen(until=until)
        client = client_factory(config, clock=clock)
        called = True  # from here on, whatever happens is the service's answer (or silence)
        try:
            accepted = client.request_render(
                idempotency_key=claim.idempotency_key,
                body={
                    "recap_id": str(recap.id),
                    "event_id": recap.event.id,
                    "photos": photos,
                },
                deadline=deadline,
                # Closed: the call is the evidence, a health check per row only costs time.
                precheck=admission.probe,
            )
        finally:
            client.close()
    except Exception as exc:
        if isinstance(exc, DatabaseError):
            # A broken connection must not poison the rest of this thread's run.
            connection.close_if_unusable_or_obsolete()
        failure = classify(exc)
        probe = admission is not None and admission.probe
        release_at = None
        if admission is not None and not admission.allowed:
            release_at = admission.retry_at
        elif called and failure.service_failure:
            # An answer about the service, its deploy, or an ambiguous one: evidence for the
            # breaker, which says how long the row waits. Never the row's cost.
            release_at = breaker.record_failure(
                side_effect_id=claim.id, error_class=failure.error_class, probe=probe, now=now()
            )
        elif probe:
            # A verdict about the row (422), or our own failure: nothing about the service
            # either way. Another row may probe once this one's claim on the probe lapses.
            breaker.abandon_probe()
        return side_effect_fail(
            claim=claim,
            failure=failure,
            error=str(exc),
            started_at=started_at,
            now=now(),
            release_at=release_at,
        )
    breaker.record_success(probe=admission.probe, now=now())
    return side_effect_complete(
        claim=claim, render_id=accepted.render_id, started_at=started_at, now=now()
    )


def dispatch_run(
    *,
    budget_seconds: float | None = None,
    max_concurrency: int | None = None,
    now: datetime | None = None,
    clock: Callable[[], float] = time.monotonic,
    client_factory: ClientFactory = RenderClient,
) -> DispatchReport:
    """One budgeted run. `now` freezes the database clock (tests simulate time with it)."""
    budget = settings.OUTBOX_DISPATCH_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    concurrency = max_concurrency or settings.RENDER_MAX_CONCURRENCY
    worst = render_dispatch_worst_case(RenderClientConfig.from_settings()).seconds
    breaker = Breaker(name=RENDER_SERVICE_BREAKER, config=BreakerConfig.from_settings())

    def current() -> datetime:
        return now or timezone.now()

    report = DispatchReport(budget_seconds=budget, worst_case_seconds=worst)
    run = BudgetClock(budget, setting="OUTBOX_DISPATCH_BUDGET_SECONDS", clock=clock)
    # What an earlier run owes (recording its outcome failed) first, then the orphans.
    RecapSideEffect.objects.pay_owed(now=current())
    report.rearmed_stale = side_effects_rearm_orphaned(now=current())
    holder = this_process()

    bulkhead = _Bulkhead(concurrency)
    seen: set[int] = set()
    in_flight: dict[Future, SideEffectClaim] = {}
    # Rows claimed ahead (at most one per slot), so that claiming costs one transaction per
    # batch rather than one per row. Each starts within one worst-case dispatch of its claim
    # (every slot frees within that), so ahead-claims are made only while the budget covers
    # two worst cases.
    ahead: deque[SideEffectClaim] = deque()
    render_inputs: dict[int, RenderInput] = {}
    exhausted = False
    try:
        while True:
            free = concurrency - len(in_flight)
            if not ahead and not exhausted and free > 0 and run.fits(worst):
                extra = concurrency if run.fits(worst, times=2) else 0
                # Closed: every free slot (and the ahead-claims); cool-down over: one row,
                # the half-open probe; open: none.
                limit = breaker.claim_limit(free + extra, now=current())
                claims = (
                    side_effects_claim(limit=limit, now=current(), exclude=seen) if limit else []
                )
                exhausted = limit > 0 and len(claims) < limit
                seen.update(claim.id for claim in claims)
                report.claimed += len(claims)
                render_inputs.update(_read_render_inputs(claims))
                ahead.extend(claims)
            while ahead and len(in_flight) < concurrency:
                claim = ahead.popleft()
                future = bulkhead.submit(
                    dispatch_one,
                    claim,
                    deadline=run.call_deadline(worst),
                    breaker=breaker,
                    now=current,
                    client_factory=client_factory,
                    clock=clock,
                    render_input=render_inputs.pop(claim.id, None),
                )
                in_flight[future] = claim
            if not in_flight:
                break
            # The calls in flight are this holder's claims: it beats while it waits on them.
            done, _ = wait(
                list(in_flight),
                timeout=settings.CLAIM_HOLDER_BEAT_SECONDS,
                return_when=FIRST_COMPLETED,
            )
            if not done:
                holder.beat_if_due()
            for future in done:
                claim = in_flight.pop(future)
                try:
                    outcome = str(future.result())
                    report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
                except Exception:
                    # Recording the outcome failed (database gone?): the claim is owed back,
                    # given back first thing next run (the same key renders once).
                    report.errors += 1
                    RecapSideEffect.objects.owe([claim])
                    logger.exception("outbox.dispatch.error", extra={"side_effect_id": claim.id})
    finally:
        bulkhead.shutdown()
    report.breaker = breaker.view(fresh=True).state
    report.elapsed_seconds = run.elapsed()
    logger.info(
        "outbox.dispatch.run",
        extra={
            "claimed": report.claimed,
            "outcomes": report.outcomes,
            "errors": report.errors,
            "breaker": report.breaker,
            "elapsed_seconds": round(report.elapsed_seconds, 3),
        },
    )
    return report


def dispatch_pass_here() -> tuple[DispatchReport, RenderCheckReport]:
    """A dispatcher run, then a render-check run — in the processing region only (with one
    region, always): the outbox follows the processing region, and the pass is fenced like
    the inbox's, so a region that stops processing sends nothing once the other starts
    (kernel/processing_region.py, docs/multi-region.md "The recap outbox")."""
    with processing_pass() as here:
        if not here:
            worst = render_dispatch_worst_case(RenderClientConfig.from_settings()).seconds
            idle = DispatchReport(
                budget_seconds=settings.OUTBOX_DISPATCH_BUDGET_SECONDS, worst_case_seconds=worst
            )
            return idle, RenderCheckReport(
                budget_seconds=settings.RENDER_CHECK_BUDGET_SECONDS, worst_case_seconds=0.0
            )
        return dispatch_run(), render_checks_run()
