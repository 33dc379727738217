from datetime import date, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ingress.archive import ArchiveFailed, RestoreFilter, restore_archived_events


def _instant(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone (add +00:00 or Z)")
    return parsed


class Command(BaseCommand):
    help = (
        "Restore one archived day of raw events (RAW_EVENT_ARCHIVE_*) into the store, or the "
        "part of it a filter selects, for search and replay. Restored rows are marked "
        "origin=restored, keep their verdict and are never delivered on their own; rows "
        "still in the store are skipped, so running it twice restores nothing more."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("day", type=date.fromisoformat, help="The UTC day, YYYY-MM-DD.")
        parser.add_argument("--source", help="Only this source's file.")
        parser.add_argument("--event-type", help="Only events of this type.")
        parser.add_argument(
            "--from",
            dest="received_from",
            type=_instant,
            help="Received at or after this ISO 8601 instant.",
        )
        parser.add_argument(
            "--until",
            dest="received_until",
            type=_instant,
            help="Received before this ISO 8601 instant.",
        )
        parser.add_argument("--dry-run", action="store_true", help="Count only; write nothing.")

    def handle(self, *args: Any, day: date, dry_run: bool = False, **options: Any) -> None:
        only = RestoreFilter(
            source=options.get("source"),
            event_type=options.get("event_type"),
            received_from=options.get("received_from"),
            received_until=options.get("received_until"),
        )
        try:
            result = restore_archived_events(day, only=only, dry_run=dry_run)
        except ArchiveFailed as exc:
            raise CommandError(str(exc)) from exc
        for line in result.lines():
            self.stdout.write(line)
