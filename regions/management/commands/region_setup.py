from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from regions.configuration import multi_region
from regions.rejoin import rejoin as rejoin_region
from regions.setup import RegionSetupError, region_setup


class Command(BaseCommand):
    help = (
        "Create or re-point this region's publications and its subscriptions to its peers "
        "(idempotent; docs/multi-region.md). Exits non-zero while a peer is not ready. "
        "--rejoin, in a region that returns after another took processing over: list the "
        "processing state it wrote and never sent, then re-copy its state tables from the "
        "processing region."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--processing-region",
            default="",
            help="the first processing region, written only when no decision exists yet",
        )
        parser.add_argument(
            "--rejoin",
            action="store_true",
            help="list this region's unsent state (the tail) and re-copy its state tables "
            "from the processing region (refused in the processing region)",
        )
        parser.add_argument(
            "--sync-timeout",
            type=float,
            default=300.0,
            help="--rejoin: seconds to wait for the state tables' copy (default 300)",
        )

    def handle(
        self,
        *args: Any,
        processing_region: str,
        rejoin: bool,
        sync_timeout: float,
        **options: Any,
    ) -> None:
        if not multi_region():
            self.stdout.write("region_setup: one region (no EVENTDROP_REGION_PEERS), nothing to do")
            return
        try:
            if rejoin:
                report, _ = rejoin_region(sync_timeout=sync_timeout)
            else:
                report = region_setup(processing_region=processing_region)
        except RegionSetupError as exc:
            raise CommandError(str(exc)) from exc
        for line in report.lines:
            self.stdout.write(f"region_setup: {line}")
        if report.failed:
            raise CommandError("; ".join(report.failed))
