"""Renders whose completion callback never arrived: ask the render service, within a budget.

A recap is `rendering` once the service accepted its render; normally the signed callback
makes it `ready`. When every callback is lost (the service's retries fell into a 503 window
of ours, a network partition, a bug), nothing else would ever ask again — the seed's one-way
street with a new name. So a recap still `rendering` at `render_check_at` (rendering_at +
RENDER_EXPECTED_SECONDS + RENDER_CALLBACK_MARGIN_SECONDS) is asked about with
GET /renders/<render_id> — a read — and:

    completed                → ready, with the video (as the callback would have done)
    failed                   → failed, with the service's reason (its verdict)
    still rendering          → asked again RENDER_CHECK_INTERVAL_SECONDS later
    404 (the service does    → asked for again: the render request is re-sent with the same
    not know the render)       idempotency key (outbox.services.render_lost_resend), so the
                               service answers with that render or accepts it anew
    anything else (5xx, 429, → asked again RENDER_CHECK_INTERVAL_SECONDS later; never
    3xx, other 4xx, timeout,   terminal: none of it is a verdict about the render
    refused, an answer we
    cannot read)

Budget: one run has RENDER_CHECK_BUDGET_SECONDS and starts a check only while what is left
covers one check's worst case (kernel/budgets.py, `render.status`; `manage.py check` holds
it against the budget, outbox.E001). The scheduled dispatcher task runs one after each
dispatch run, the nightly recovery one more (outbox/tasks.py). After the first failure that
speaks about the service as a whole (refused, timed out, 5xx, 429) the run stops: the others
wait for the next run instead of each costing a timeout against a service that is down.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from kernel.budgets import BudgetClock, render_status_worst_case
from kernel.retry import classify
from outbox.errors import RenderError, RenderHTTPError
from outbox.render_client import RenderClient, RenderClientConfig
from outbox.services import render_lost_resend, render_status_record
from recaps.errors import RecapNotFound
from recaps.services import RenderCheckClaim, recaps_claim_render_checks

logger = logging.getLogger(__name__)

# Called as factory(config, clock=clock), like the dispatcher's.
ClientFactory = Callable[..., RenderClient]

READY = "ready"
FAILED = "failed"
RENDERING = "rendering"
RESENT = "resent"
RETRY_LATER = "retry_later"
MOVED_ON = "moved_on"


@dataclass
class RenderCheckReport:
    budget_seconds: float
    worst_case_seconds: float
    checked: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    # A service-wide failure ended the run early (the rest wait for the next run).
    stopped_early: bool = False
    errors: int = 0
    elapsed_seconds: float = 0.0

    def count(self, outcome: str) -> int:
        return self.outcomes.get(outcome, 0)

    def summary(self) -> str:
        stopped = " (stopped: the render service is failing)" if self.stopped_early else ""
        return (
            f"render checks {self.checked}: ready {self.count(READY)}, failed "
            f"{self.count(FAILED)}, still rendering {self.count(RENDERING)}, asked for again "
            f"{self.count(RESENT)}, retry later "
            f"{self.count(RETRY_LATER)}, errors {self.errors}{stopped}; "
            f"{self.elapsed_seconds:.1f} s of {self.budget_seconds:.1f} s budget "
            f"(worst-case check {self.worst_case_seconds:.1f} s)"
        )


def _check_one(
    claim: RenderCheckClaim, *, client: RenderClient, deadline: float, now: datetime
) -> tuple[str, bool]:
    """Ask about one render and record the answer. Returns (outcome, service failing)."""
    try:
        return _ask_and_record(claim, client=client, deadline=deadline, now=now)
    except RecapNotFound:
        return MOVED_ON, False  # deleted while we asked: nothing left to record


def _ask_and_record(
    claim: RenderCheckClaim, *, client: RenderClient, deadline: float, now: datetime
) -> tuple[str, bool]:
    try:
        status = client.render_status(render_id=claim.render_id, deadline=deadline)
    except RenderError as exc:
        if isinstance(exc, RenderHTTPError) and exc.status == 404:
            resent = render_lost_resend(recap_id=claim.recap_id, render_id=claim.render_id, now=now)
            return (RESENT if resent else MOVED_ON), False
        failure = classify(exc)
        # Its next check was scheduled by the claim: nothing to write, nothing terminal.
        logger.info(
            "outbox.render_check.retry_later",
            extra={"recap_id": str(claim.recap_id), "error_class": failure.error_class},
        )
        return RETRY_LATER, failure.service_failure
    outcome = render_status_record(recap_id=claim.recap_id, status=status, now=now)
    return str(outcome), False


def render_checks_run(
    *,
    budget_seconds: float | None = None,
    now: Callable[[], datetime] = timezone.now,
    clock: Callable[[], float] = time.monotonic,
    client_factory: ClientFactory = RenderClient,
) -> RenderCheckReport:
    """One budgeted run over the recaps whose callback is overdue."""
    budget = settings.RENDER_CHECK_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    config = RenderClientConfig.from_settings()
    worst = render_status_worst_case(config).seconds
    report = RenderCheckReport(budget_seconds=budget, worst_case_seconds=worst)
    run = BudgetClock(budget, setting="RENDER_CHECK_BUDGET_SECONDS", clock=clock)
    client: RenderClient | None = None
    try:
        while not report.stopped_early:
            fits = run.how_many(worst)
            if fits < 1:
                break
            # Claim no more than this run can still ask about: a claimed recap waits one
            # interval for its next check.
            claims = recaps_claim_render_checks(
                limit=min(fits, settings.RENDER_CHECK_BATCH_SIZE), now=now()
            )
            if not claims:
                break
            client = client or client_factory(config, clock=clock)
            for claim in claims:
                report.checked += 1
                try:
                    outcome, service_failing = _check_one(
                        claim,
                        client=client,
                        deadline=run.call_deadline(worst),
                        now=now(),
                    )
                except DatabaseError:
                    # Recording failed (our database): the recap stays rendering, due again
                    # one interval later. Stop; the next run tries again.
                    report.errors += 1
                    report.stopped_early = True
                    logger.exception(
                        "outbox.render_check.error", extra={"recap_id": str(claim.recap_id)}
                    )
                    break
                report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
                if service_failing:
                    report.stopped_early = True
                    break
    finally:
        if client is not None:
            client.close()
    report.elapsed_seconds = run.elapsed()
    logger.info(
        "outbox.render_check.run",
        extra={
            "checked": report.checked,
            "outcomes": report.outcomes,
            "errors": report.errors,
            "elapsed_seconds": round(report.elapsed_seconds, 3),
        },
    )
    return report
