from django.conf import settings
from django.core.management.base import BaseCommand

from kernel.worker_loop import run_until_stopped
from outbox.configuration import dispatch_command_start
from outbox.dispatcher import DispatchReport, dispatch_pass_here
from outbox.render_status import RenderCheckReport


def _dispatch_pass() -> tuple[DispatchReport, RenderCheckReport]:
    """One dispatcher run, then one render-check run (the scheduled task's pass); with several
    regions only in the processing region, fenced for the pass (kernel/processing_region.py)."""
    return dispatch_pass_here()


class Command(BaseCommand):
    help = (
        "Dispatch due recap side effects to the render service and ask about renders whose "
        "callback is overdue, one budgeted pass after another until stopped (SIGTERM/SIGINT "
        "finish the current pass); --once runs once. Refuses to start, touching no row, "
        "when the render service's configuration is incomplete."
    )
    # The refusal below comes first, as one line; the other checks run right after it.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        # Django adds this only to commands that let it run the checks; `make run` checks
        # once for every process it starts.
        parser.add_argument("--skip-checks", action="store_true", help="skip system checks")

    def handle(self, *args, once: bool, **options):
        dispatch_command_start(
            self, who="dispatch_side_effects", skip_checks=bool(options.get("skip_checks"))
        )
        if once:
            dispatched, checked = _dispatch_pass()
            self.stdout.write(f"dispatch_side_effects: {dispatched.summary()}; {checked.summary()}")
            return

        run_until_stopped(
            name="dispatch_side_effects",
            run_pass=_dispatch_pass,
            is_idle=lambda reports: not reports[0].claimed and not reports[1].checked,
            idle_sleep_seconds=settings.OUTBOX_IDLE_SLEEP_SECONDS,
            write=self.stdout.write,
            describe=lambda reports: (
                f"{reports[0].summary()}; {reports[1].summary()}"
                if reports[0].claimed or reports[1].checked
                else None
            ),
        )
