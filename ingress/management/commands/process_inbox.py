from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from ingress.deliveries import delivery_retry_policy
from ingress.inbox import InboxPass, inbox_run_once, raw_event_retry_policy
from kernel.worker_loop import run_until_stopped


def _summary(result: InboxPass) -> str:
    return f"verified {result.verified}, delivered {result.delivered}, re-armed {result.rearmed}"


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
            raise CommandError("--batch-size must be at least 1")
        # A retry setting that cannot work stops the worker here, not every pass later.
        try:
            raw_event_retry_policy()
            delivery_retry_policy()
        except ValueError as exc:
            raise CommandError(
                f"{exc}: check INBOX_MAX_ROW_FAILURES, INBOX_ROW_RETRY_BASE_SECONDS, "
                "DELIVERY_MAX_ATTEMPTS and DELIVERY_BACKOFF_*"
            ) from exc
        if once:
            self.stdout.write(_summary(inbox_run_once(limit=batch_size)))
            return
        run_until_stopped(
            name="process_inbox",
            run_pass=lambda: inbox_run_once(limit=batch_size),
            is_idle=lambda result: result.idle,
            idle_sleep_seconds=settings.INBOX_IDLE_SLEEP_SECONDS,
            write=self.stdout.write,
        )
