from typing import Any

from django.core.management.base import CommandParser

from ingress.reconcile.command import ReconcileCommand
from ingress.reconcile.stripe import stripe_reconcile


class Command(ReconcileCommand):
    help = (
        "Compare Stripe's Events (last 30 days at most) with the dedup index and backfill the "
        "missing ones as raw events, which then take the normal path to their handlers. "
        "Records the run and its drift; also runs nightly (ingress.reconcile_stripe)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--source", default="stripe", help="webhook source (default stripe)")

    def handle(
        self, *args: Any, source: str, dry_run: bool, fail_on_drift: bool, **options: Any
    ) -> None:
        window = self.window_options(options)
        self.run_reconciliation(
            lambda: stripe_reconcile(source=source, dry_run=dry_run, **window),
            fail_on_drift=fail_on_drift,
        )
