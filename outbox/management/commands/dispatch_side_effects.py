import logging
import signal
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import DatabaseError, close_old_connections

from outbox.dispatcher import dispatch_run

logger = logging.getLogger(__name__)


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

        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write("dispatch_side_effects: running (Ctrl-C to stop)")
        while not stopping:
            close_old_connections()
            try:
                report = dispatch_run()
            except DatabaseError:
                # Rows stay where they are; the next run picks them up.
                logger.exception("outbox.dispatch.run_failed")
                time.sleep(settings.OUTBOX_IDLE_SLEEP_SECONDS)
                continue
            if report.claimed:
                self.stdout.write(f"dispatch_side_effects: {report.summary()}")
            else:
                time.sleep(settings.OUTBOX_IDLE_SLEEP_SECONDS)
        self.stdout.write("dispatch_side_effects: stopped")
