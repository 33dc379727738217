"""django-q2 entry points (thin: they call the dispatcher, the render checks and recovery).

Both refuse to run when the dispatcher's configuration is incomplete
(outbox/configuration.py): the task fails, visibly, in django-q2's failed tasks, with the
one-line reason, and no row is touched.
"""

from kernel.processing_region import ProcessingWritesRefused, require_processing_region
from outbox.configuration import require_dispatch_configuration
from outbox.dispatcher import dispatch_pass_here
from outbox.render_status import render_checks_run
from outbox.services import outbox_recover


def dispatch_side_effects() -> str:
    """Every two minutes: one budgeted dispatcher run (OUTBOX_DISPATCH_BUDGET_SECONDS), then
    one budgeted render-check run (RENDER_CHECK_BUDGET_SECONDS) for lost callbacks."""
    require_dispatch_configuration(who="outbox.tasks.dispatch_side_effects")
    dispatched, checked = dispatch_pass_here()
    return f"{dispatched.summary()}; {checked.summary()}"


def recover_recaps() -> str:
    """Nightly: ask about overdue renders, then recreate missing render rows and re-arm
    stuck ones (which triggers no render itself)."""
    require_dispatch_configuration(who="outbox.tasks.recover_recaps")
    try:
        require_processing_region()
    except ProcessingWritesRefused as exc:
        # Scheduled in every region; recovery writes processing state, so it runs in the
        # processing region only (docs/multi-region.md).
        return f"skipped: {exc}"
    checks = render_checks_run()
    return f"{outbox_recover().summary()}; {checks.summary()}"
