import logging
import signal
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import DatabaseError, close_old_connections

from ingress.inbox import inbox_run_once

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = (
        "Verify, deduplicate and deliver stored webhooks. Runs until stopped (SIGTERM/SIGINT "
        "finish the current batch first); --once makes one pass and exits."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument("--batch-size", type=int, default=None, help="rows per claim")

    def handle(self, *args, once: bool, batch_size: int | None, **options):
        if batch_size is not None and batch_size < 1:
            self.stderr.write("--batch-size must be at least 1")
            raise SystemExit(2)
        if once:
            result = inbox_run_once(limit=batch_size)
            self.stdout.write(
                f"verified {result.verified}, delivered {result.delivered}, "
                f"re-armed {result.rearmed}"
            )
            return

        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write("process_inbox: running (Ctrl-C to stop)")
        while not stopping:
            close_old_connections()
            try:
                result = inbox_run_once(limit=batch_size)
            except DatabaseError:
                # The database is down or restarting: nothing is lost (rows stay pending),
                # so wait and try again instead of dying and relying on a supervisor.
                logger.exception("ingress.inbox.pass_failed")
                time.sleep(5)
                continue
            if result.idle:
                time.sleep(settings.INBOX_IDLE_SLEEP_SECONDS)
        self.stdout.write("process_inbox: stopped")
