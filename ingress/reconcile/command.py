"""What `reconcile_stripe` and `reconcile_github` share: the window options and the report.

Exit codes: 0 when the run finished (complete, or incomplete with the reason printed);
1 when it failed (credentials, permissions, configuration: a clear message, no traceback)
or could not start; 3 with --fail-on-drift when the drift exceeds RECONCILE_DRIFT_SLO.
"""

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypedDict

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from ingress.models import ReconciliationStatus
from ingress.reconcile.errors import WINDOW_NOT_ISO, ReconcileBusy, ReconcileInvalid
from ingress.reconcile.runs import ReconcileOutcome
from kernel.processing_region import ProcessingWritesRefused

DRIFT_EXIT_CODE = 3
OVER_SLO = "Drift {drift:.4f} % exceeds the SLO of {slo:.4f} % (RECONCILE_DRIFT_SLO)."
MORE_MISSING = "… and {count} more (the run record keeps the first ids)."


class Window(TypedDict):
    since: datetime | None
    until: datetime | None


class ReconcileCommand(BaseCommand):
    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", help="window start, ISO 8601 with a zone")
        parser.add_argument("--until", help="window end (exclusive), ISO 8601 with a zone")
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="compare and list only; change and record nothing",
        )
        parser.add_argument(
            "--fail-on-drift",
            action="store_true",
            help=f"exit {DRIFT_EXIT_CODE} when the drift exceeds RECONCILE_DRIFT_SLO",
        )

    def window_options(self, options: dict[str, Any]) -> Window:
        return Window(
            since=_moment("--since", options["since"]), until=_moment("--until", options["until"])
        )

    def run_reconciliation(
        self, start: Callable[[], ReconcileOutcome], *, fail_on_drift: bool
    ) -> None:
        try:
            outcome: ReconcileOutcome = start()
        except (ReconcileInvalid, ReconcileBusy, ProcessingWritesRefused) as exc:
            raise CommandError(str(exc)) from exc
        for note in outcome.notes:
            self.stdout.write(f"note: {note}")
        for line in outcome.missing_lines:
            self.stdout.write(f"missing: {line}")
        unlisted = outcome.tally.missing_count - len(outcome.missing_lines)
        if unlisted > 0:
            self.stdout.write(MORE_MISSING.format(count=unlisted))
        slo = settings.RECONCILE_DRIFT_SLO
        self.stdout.write(outcome.summary(slo))
        if outcome.status == ReconciliationStatus.FAILED:
            raise CommandError(outcome.error)
        if outcome.error:
            self.stdout.write(self.style.WARNING(outcome.error))
        if fail_on_drift and outcome.over_slo(slo):
            raise CommandError(
                OVER_SLO.format(drift=(outcome.drift or 0) * 100, slo=slo * 100),
                returncode=DRIFT_EXIT_CODE,
            )


def _moment(option: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = parse_datetime(value)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise CommandError(WINDOW_NOT_ISO.format(option=option, value=value))
    return moment
