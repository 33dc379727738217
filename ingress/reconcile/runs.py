"""One reconciliation run from start to record, whatever the provider.

`reconcile_run` starts the run record (unless it is a dry run), lets the provider's
`compare` walk the provider's pages — classifying, repairing and reporting progress after
each page — and finishes the record with the status its way of ending implies:

    compare returned              -> complete
    ReconcileStopped (rate limit, page limit, budget, provider down)  -> incomplete
    ReconcileFailed (401/403, not configured)                         -> failed
    KeyboardInterrupt             -> incomplete, then re-raised
    any other exception (a bug)   -> failed, then re-raised with its traceback

The provider-specific parts live in stripe.py and github.py.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django.utils import timezone

from ingress.models import ReconciliationRun, ReconciliationStatus
from ingress.reconcile.errors import INTERRUPTED, ReconcileFailed, ReconcileStopped
from ingress.reconcile.services import (
    Tally,
    reconciliation_run_finish,
    reconciliation_run_progress,
    reconciliation_run_start,
)
from ingress.reconcile.window import Window
from kernel.processing_region import require_processing_region

logger = logging.getLogger(__name__)

# At most this many missing events are listed line by line in a command's output.
LISTED_MISSING = 50


@dataclass
class RunState:
    """What `compare` reports into: counts, notes, and lines describing missing events."""

    dry_run: bool
    tally: Tally = field(default_factory=Tally)
    notes: list[str] = field(default_factory=list)
    missing_lines: list[str] = field(default_factory=list)
    progress: Callable[[], None] = lambda: None

    def list_missing(self, line: str) -> None:
        if len(self.missing_lines) < LISTED_MISSING:
            self.missing_lines.append(line)


@dataclass(frozen=True)
class ReconcileOutcome:
    provider: str
    label: str  # "Stripe", "GitHub"
    source: str
    scope: str
    window: Window
    dry_run: bool
    status: str
    error: str
    tally: Tally
    notes: list[str]
    missing_lines: list[str]
    run_id: int | None

    @property
    def drift(self) -> float | None:
        return None if self.status == ReconciliationStatus.FAILED else self.tally.drift

    def over_slo(self, slo: float) -> bool:
        return self.drift is not None and self.drift > slo

    def summary(self, slo: float) -> str:
        """One line: what was compared, what was repaired, the drift against the SLO."""
        t = self.tally
        who = f"{self.provider} reconciliation"
        who += " (dry run, nothing changed)" if self.dry_run else f" #{self.run_id}"
        if self.scope:
            who += f" [{self.scope}]"
        if self.provider == "stripe":
            repaired = f"{'would backfill' if self.dry_run else 'backfilled'} "
            repaired += str(t.missing_count if self.dry_run else t.backfilled_count)
        else:
            repaired = f"{'would redeliver' if self.dry_run else 'redelivered'} "
            repaired += str(t.missing_count if self.dry_run else t.redelivered_count)
        if self.drift is None:
            drift = "drift unknown"
        else:
            verdict = "OVER SLO" if self.over_slo(slo) else "within SLO"
            drift = f"drift {self.drift * 100:.4f} % (SLO {slo * 100:.4f} %, {verdict})"
        return (
            f"{who} {self.status}: window {self.window}, {t.pages} page(s); "
            f"{self.label} listed {t.provider_count}, known {t.known_count}, "
            f"pending {t.pending_count}, missing {t.missing_count}, {repaired}; {drift}"
        )


def reconcile_run(
    *,
    provider: str,
    label: str,
    source: str,
    scope: str,
    window: Window,
    dry_run: bool,
    compare: Callable[[RunState], None],
) -> ReconcileOutcome:
    run = None
    if not dry_run:
        # The run's record and what it repairs are processing state: a real run is refused
        # in the standby region, before anything is asked or written; a dry run is a read.
        require_processing_region()
        run = reconciliation_run_start(provider=provider, source=source, scope=scope, window=window)
    state = RunState(dry_run=dry_run, notes=list(window.notes))
    if run is not None:
        state.progress = lambda: reconciliation_run_progress(run=run, tally=state.tally)
    status, error = ReconciliationStatus.COMPLETE, ""
    try:
        compare(state)
    except ReconcileStopped as exc:
        status, error = ReconciliationStatus.INCOMPLETE, str(exc)
    except ReconcileFailed as exc:
        status, error = ReconciliationStatus.FAILED, str(exc)
    except BaseException as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        if run is not None:
            _finish_quietly(
                run,
                state,
                status=(
                    ReconciliationStatus.INCOMPLETE if interrupted else ReconciliationStatus.FAILED
                ),
                error=INTERRUPTED.format(error_class=type(exc).__name__, pages=state.tally.pages),
            )
        raise
    if run is not None:
        reconciliation_run_finish(
            run=run, tally=state.tally, status=status, error=error, notes=state.notes
        )
    else:
        logger.info(
            "ingress.reconcile.dry_run",
            extra={
                "provider": provider,
                "source": source,
                "scope": scope,
                "status": str(status),
                "missing": state.tally.missing_count,
            },
        )
    return ReconcileOutcome(
        provider=provider,
        label=label,
        source=source,
        scope=scope,
        window=window,
        dry_run=dry_run,
        status=status,
        error=error,
        tally=state.tally,
        notes=state.notes,
        missing_lines=state.missing_lines,
        run_id=run.id if run is not None else None,
    )


def _finish_quietly(
    run: ReconciliationRun, state: RunState, *, status: ReconciliationStatus, error: str
) -> None:
    """Record how a run ended on the way out of an exception that must propagate."""
    try:
        reconciliation_run_finish(
            run=run,
            tally=state.tally,
            status=status,
            error=error,
            notes=state.notes,
            now=timezone.now(),
        )
    except Exception:
        # The database may be what failed; the row then goes stale and the next start marks
        # it abandoned. The original exception is the one worth seeing.
        logger.exception("ingress.reconcile.finish_failed", extra={"run_id": run.id})
