from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ingress.partitions import raw_event_partitions_maintain


class Command(BaseCommand):
    help = (
        "Maintain the raw event store: create daily partitions ahead, move rows out of the "
        "DEFAULT partition, drop partitions past RAW_EVENT_RETENTION_DAYS (never one with "
        "events in flight; with RAW_EVENT_ARCHIVE_ENABLED only after its archive is written "
        "and verified) and delete rejected events past their shorter retention. "
        "Also runs hourly as the django-q2 schedule ingress.raw_event_partitions."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Only report what would be done; change nothing.",
        )

    def handle(self, *args: Any, dry_run: bool = False, **options: Any) -> None:
        result = raw_event_partitions_maintain(dry_run=dry_run)
        for line in result.lines():
            self.stdout.write(line)
        if result.archive_failed:
            # Exit non-zero: a cron job or an operator sees the kept partitions.
            raise CommandError(
                f"{len(result.archive_failed)} partition(s) kept: their archive failed"
            )
