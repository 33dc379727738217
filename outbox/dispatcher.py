"""The dispatcher: claims due render rows and asks the render service, within a budget.

One run (`dispatch_run`) has a budget, OUTBOX_DISPATCH_BUDGET_SECONDS (60 s), and keeps
claiming while what is left still covers one worst-case dispatch (outbox/budgets.py): not
one recap per run, as in the seed, but never a dispatch that could outlive the run either.
At most RENDER_MAX_CONCURRENCY render calls are in flight at once (a bulkhead: a slow render
service ties up that many threads and connections, not all of them).

Each row is tried at most once per run, so even a zero-length backoff cannot burn all five
attempts within one run; between runs, the backoff and the circuit breaker spread them out.
Several dispatchers on several hosts can run at once: claims are SELECT … FOR UPDATE SKIP
LOCKED, committed as `processing` before any call, so no row is ever dispatched twice at
the same time.
"""

import logging
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.utils import timezone

from outbox.breaker import (
    RENDER_SERVICE_BREAKER,
    BreakerConfig,
    circuit_breaker_acquire,
    circuit_breaker_record_failure,
    circuit_breaker_record_success,
)
from outbox.budgets import render_dispatch_worst_case
from outbox.errors import classify
from outbox.models import AttemptOutcome, BreakerState
from outbox.selectors import circuit_breaker_get
from outbox.services import (
    Claim,
    side_effect_complete,
    side_effect_fail,
    side_effect_release,
    side_effects_claim,
    side_effects_rearm_stale,
)
from recaps.errors import EventNotFound, RenderCircuitOpen, RenderError, TooFewPhotos
from recaps.models import RecapStatus
from recaps.render_client import RenderClient, RenderClientConfig
from recaps.selectors import event_photo_keys, recap_get

logger = logging.getLogger(__name__)

# Called as factory(config, clock=clock): the client measures deadlines on the run's clock.
ClientFactory = Callable[..., RenderClient]


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
        return (
            f"claimed {self.claimed}: done {self.count(AttemptOutcome.DONE)}, "
            f"retry later {self.count(AttemptOutcome.TRANSIENT)}, "
            f"dead {self.count(AttemptOutcome.DEAD) + self.count(AttemptOutcome.PERMANENT)}, "
            f"skipped {self.count(AttemptOutcome.SKIPPED)} (breaker {self.breaker}), "
            f"errors {self.errors}; re-armed {self.rearmed_stale} stale; "
            f"{self.elapsed_seconds:.1f} s of {self.budget_seconds:.1f} s budget "
            f"(worst-case dispatch {self.worst_case_seconds:.1f} s)"
        )


class _InlineExecutor:
    """A bulkhead of one needs no thread: run the dispatch here, return a finished future."""

    def submit(self, fn, *args, **kwargs) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future

    def shutdown(self, wait: bool = True) -> None:
        return None


def _in_worker_thread(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    finally:
        # Each pool thread opened its own connection; do not leak it past the run.
        connection.close()


def dispatch_one(
    claim: Claim,
    *,
    deadline: float,
    now: Callable[[], datetime] = timezone.now,
    client_factory: ClientFactory = RenderClient,
    breaker_config: BreakerConfig | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Dispatch one claimed row and record its outcome. Returns the AttemptOutcome."""
    started_at = now()
    config = RenderClientConfig.from_settings()
    permit = None
    try:
        recap = recap_get(recap_id=claim.recap_id)
        if recap.status == RecapStatus.READY:
            # A callback got here first (e.g. after an ambiguous timeout): nothing to ask.
            return side_effect_complete(
                claim=claim, render_id=recap.render_id, started_at=started_at, now=now()
            )
        config.require_configured()
        if recap.event is None:
            raise EventNotFound()
        photos = event_photo_keys(event=recap.event)
        if len(photos) < settings.RECAP_MIN_PHOTOS:
            raise TooFewPhotos(count=len(photos), minimum=settings.RECAP_MIN_PHOTOS)
        permit = circuit_breaker_acquire(
            name=RENDER_SERVICE_BREAKER, now=now(), config=breaker_config
        )
        if not permit.allowed:
            until = permit.retry_at.isoformat() if permit.retry_at else "later"
            raise RenderCircuitOpen(until=until)
        client = client_factory(config, clock=clock)
        try:
            accepted = client.request_render(
                idempotency_key=claim.idempotency_key,
                body={
                    "recap_id": str(recap.id),
                    "event_id": recap.event.id,
                    "photos": photos,
                },
                deadline=deadline,
            )
        finally:
            client.close()
    except Exception as exc:
        failure = classify(exc)
        if isinstance(exc, RenderCircuitOpen):
            return side_effect_release(
                claim=claim,
                retry_at=permit.retry_at if permit else None,
                error=str(exc),
                started_at=started_at,
                now=now(),
            )
        if permit is not None and permit.allowed:
            # The service was asked: its answer (or silence) is evidence for the breaker.
            if failure.service_failure:
                circuit_breaker_record_failure(
                    name=RENDER_SERVICE_BREAKER,
                    error_class=failure.error_class,
                    now=now(),
                    config=breaker_config,
                )
            else:
                circuit_breaker_record_success(name=RENDER_SERVICE_BREAKER)
        return side_effect_fail(
            claim=claim, failure=failure, error=str(exc), started_at=started_at, now=now()
        )
    circuit_breaker_record_success(name=RENDER_SERVICE_BREAKER)
    return side_effect_complete(
        claim=claim, render_id=accepted.render_id, started_at=started_at, now=now()
    )


def _claim_limit(free: int, at: datetime, config: BreakerConfig) -> int | None:
    """How many rows to claim now, given the shared breaker; None means "probe first".

    Read without a lock: a stale view only costs a skipped, refunded attempt, which
    dispatch_one handles.
    """
    breaker = circuit_breaker_get(name=RENDER_SERVICE_BREAKER)
    if breaker is None or breaker.state == BreakerState.CLOSED:
        return free
    if breaker.state == BreakerState.OPEN and at < breaker.open_until:
        return 0
    if (
        breaker.state == BreakerState.HALF_OPEN
        and at < breaker.probe_started_at + config.probe_timeout
    ):
        return 0  # another dispatcher's probe is under way
    return None


def _probe(
    *,
    now: datetime,
    clock: Callable[[], float],
    client_factory: ClientFactory,
    config: BreakerConfig,
) -> bool:
    """The half-open probe: a health check, not a row's dispatch.

    A probe made with a real row would charge that row an attempt per failed probe, and
    the same earliest-due rows would be picked every cool-down: a long outage would kill
    them one by one, which is exactly the seed's loss, only slower. The health check costs
    no row anything.
    """
    permit = circuit_breaker_acquire(name=RENDER_SERVICE_BREAKER, now=now, config=config)
    if not permit.allowed:
        return False
    client_config = RenderClientConfig.from_settings()
    client = client_factory(client_config, clock=clock)
    try:
        client.check_health(deadline=clock() + client_config.health.total)
    except RenderError as exc:
        circuit_breaker_record_failure(
            name=RENDER_SERVICE_BREAKER,
            error_class=classify(exc).error_class,
            now=now,
            config=config,
        )
        return False
    finally:
        client.close()
    circuit_breaker_record_success(name=RENDER_SERVICE_BREAKER)
    return True


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
    worst = render_dispatch_worst_case().seconds
    breaker_config = BreakerConfig.from_settings()

    def current() -> datetime:
        return now or timezone.now()

    report = DispatchReport(budget_seconds=budget, worst_case_seconds=worst)
    start = clock()
    run_deadline = start + budget
    report.rearmed_stale = side_effects_rearm_stale(now=current())

    executor = (
        ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="render-dispatch")
        if concurrency > 1
        else _InlineExecutor()
    )
    seen: set[int] = set()
    in_flight: dict[Future, Claim] = {}
    exhausted = False
    try:
        while True:
            free = concurrency - len(in_flight)
            if not exhausted and free > 0 and run_deadline - clock() >= worst:
                limit = _claim_limit(free, current(), breaker_config)
                if limit is None:
                    # Cool-down over: probe once, before any row is risked.
                    probed = not in_flight and _probe(
                        now=current(),
                        clock=clock,
                        client_factory=client_factory,
                        config=breaker_config,
                    )
                    limit = free if probed else 0
                claims = (
                    side_effects_claim(limit=limit, now=current(), exclude=seen) if limit else []
                )
                exhausted = limit > 0 and len(claims) < limit
                for claim in claims:
                    seen.add(claim.id)
                    report.claimed += 1
                    deadline = min(clock() + worst, run_deadline)
                    call = (dispatch_one, claim)
                    kwargs = {
                        "deadline": deadline,
                        "now": current,
                        "client_factory": client_factory,
                        "breaker_config": breaker_config,
                        "clock": clock,
                    }
                    future = (
                        executor.submit(_in_worker_thread, *call, **kwargs)
                        if concurrency > 1
                        else executor.submit(*call, **kwargs)
                    )
                    in_flight[future] = claim
                if not claims and not in_flight:
                    break
            elif not in_flight:
                break
            done, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
            for future in done:
                claim = in_flight.pop(future)
                try:
                    outcome = str(future.result())
                    report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
                except Exception:
                    # Recording the outcome failed (database gone?): the row stays
                    # `processing` and is re-armed once stale. Nothing is lost.
                    report.errors += 1
                    logger.exception("outbox.dispatch.error", extra={"side_effect_id": claim.id})
    finally:
        executor.shutdown(wait=True)
    breaker = circuit_breaker_get(name=RENDER_SERVICE_BREAKER)
    report.breaker = breaker.state if breaker else BreakerState.CLOSED
    report.elapsed_seconds = clock() - start
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
