from django.core.management.base import BaseCommand, CommandError

from kernel.processing_region import ProcessingWritesRefused, require_processing_region
from outbox.configuration import dispatch_command_start
from outbox.render_status import render_checks_run
from outbox.services import outbox_recover


class Command(BaseCommand):
    help = (
        "Nightly recovery: ask the render service about renders whose callback is overdue, "
        "create the missing render row of every paid recap, re-arm rows stuck in processing, "
        "count recaps stuck rendering. Requests no render itself."
    )
    requires_system_checks: list[str] = []

    def handle(self, *args, **options):
        dispatch_command_start(
            self, who="recover_recaps", skip_checks=bool(options.get("skip_checks"))
        )
        try:
            require_processing_region()  # side effects and recaps are processing state
        except ProcessingWritesRefused as exc:
            raise CommandError(str(exc)) from exc
        checks = render_checks_run()
        self.stdout.write(f"recover_recaps: {outbox_recover().summary()}; {checks.summary()}")
