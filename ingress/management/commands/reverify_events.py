from datetime import datetime

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from ingress.models import RawEvent, RejectionReason, SignatureStatus
from ingress.services import raw_event_reverify
from ingress.sources import all_sources
from kernel.processing_region import ProcessingWritesRefused, require_processing_region


class Command(BaseCommand):
    help = (
        "Re-verify rejected raw events (e.g. after fixing a secret). Select by ids or by "
        "--source/--reason/--since; prints the new verdict counts."
    )

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="*", type=int, help="raw event ids")
        parser.add_argument("--source")
        parser.add_argument("--reason", choices=RejectionReason.values)
        parser.add_argument("--since", help="ISO datetime, e.g. 2026-11-30T08:00:00Z")
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args, ids, source, reason, since, dry_run, **options):
        events = RawEvent.objects.filter(signature_status=SignatureStatus.REJECTED)
        if not (ids or source or reason or since):
            raise CommandError("give event ids or at least one of --source, --reason, --since")
        if ids:
            events = events.filter(id__in=ids)
        if source:
            events = events.filter(source=source)
            self._require_known_source(source, rejected_of_source=events)
        if reason:
            events = events.filter(rejection_reason=reason)
        if since:
            when: datetime | None = parse_datetime(since)
            if when is None or when.tzinfo is None:
                raise CommandError(f"--since must be an ISO datetime with a zone, got {since!r}")
            events = events.filter(received_at__gte=when)
        selected = list(events.order_by("received_at").only("id"))
        if dry_run:
            self.stdout.write(f"would re-verify {len(selected)} rejected event(s)")
            return
        try:
            require_processing_region()  # verdicts are processing state (multi-region.md)
        except ProcessingWritesRefused as exc:
            raise CommandError(str(exc)) from exc
        outcomes: dict[str, int] = {}
        for event in selected:
            result = raw_event_reverify(raw_event=event)
            key = (
                result.signature_status if not result.rejection_reason else result.rejection_reason
            )
            outcomes[key] = outcomes.get(key, 0) + 1
        summary = ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())) or "nothing to do"
        self.stdout.write(f"re-verified {len(selected)} event(s) — {summary}")

    def _require_known_source(self, source: str, *, rejected_of_source) -> None:
        """A misspelt source is an error, not "nothing to do" (which reads as "all fine").
        A source no longer configured still counts while rejected rows of it are stored."""
        configured = sorted(all_sources())
        if source in configured or rejected_of_source.exists():
            return
        raise CommandError(
            f"unknown source {source!r}: not configured and no rejected event stored under it "
            f"(configured: {', '.join(configured)})"
        )
