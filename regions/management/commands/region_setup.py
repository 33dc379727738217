from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from regions.configuration import multi_region
from regions.setup import RegionSetupError, region_setup


class Command(BaseCommand):
    help = (
        "Create or re-point this region's publications and its subscriptions to its peers "
        "(idempotent; docs/multi-region.md). Exits non-zero while a peer is not ready."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--processing-region",
            default="",
            help="the first processing region, written only when no decision exists yet",
        )

    def handle(self, *args: Any, processing_region: str, **options: Any) -> None:
        if not multi_region():
            self.stdout.write("region_setup: one region (no EVENTDROP_REGION_PEERS), nothing to do")
            return
        try:
            report = region_setup(processing_region=processing_region)
        except RegionSetupError as exc:
            raise CommandError(str(exc)) from exc
        for line in report.lines:
            self.stdout.write(f"region_setup: {line}")
        if report.failed:
            raise CommandError("; ".join(report.failed))
