from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ingress.reconcile.errors import ReconcileInvalid
from ingress.reconcile.signature_questions import signature_questions_ask
from kernel.processing_region import ProcessingWritesRefused


class Command(BaseCommand):
    help = (
        "Answer the open signature questions (events whose body-only signature was seen "
        "under another delivery id) from GitHub's delivery logs of RECONCILE_GITHUB_HOOKS: "
        "a GUID GitHub lists is handled, one it does not list once it could is rejected "
        "replayed_signature, the rest wait. Also runs every 5 minutes. Exits 1 when GitHub "
        "could not be asked (configuration, credentials)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--source", default="github", help="webhook source (default github)")

    def handle(self, *args: Any, source: str, **options: Any) -> None:
        try:
            outcome = signature_questions_ask(source=source)
        except (ReconcileInvalid, ProcessingWritesRefused) as exc:
            raise CommandError(str(exc)) from exc
        for line in outcome.lines:
            self.stdout.write(line)
        self.stdout.write(outcome.summary())
        if outcome.error:
            raise CommandError(outcome.error)
