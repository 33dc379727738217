from django.conf import settings
from django.core.management.base import BaseCommand

from eventdrop.worker_loop import run_until_stopped
from outbox.dispatcher import dispatch_run


class Command(BaseCommand):
    help = (
        "Dispatch due recap side effects to the render service, one budgeted run after "
        "another until stopped (SIGTERM/SIGINT finish the current run); --once runs once."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="one run, then exit")

    def handle(self, *args, once: bool, **options):
        if once:
            self.stdout.write(f"dispatch_side_effects: {dispatch_run().summary()}")
            return

        run_until_stopped(
            name="dispatch_side_effects",
            run_pass=dispatch_run,
            is_idle=lambda report: not report.claimed,
            idle_sleep_seconds=settings.OUTBOX_IDLE_SLEEP_SECONDS,
            write=self.stdout.write,
            describe=lambda report: report.summary() if report.claimed else None,
        )
