"""django-q2 entry points (thin: they call the dispatcher and the recovery service)."""

from outbox.dispatcher import dispatch_run
from outbox.services import outbox_recover


def dispatch_side_effects() -> str:
    """Every two minutes: one budgeted dispatcher run (OUTBOX_DISPATCH_BUDGET_SECONDS)."""
    return dispatch_run().summary()


def recover_recaps() -> str:
    """Nightly: recreate missing render rows and re-arm stuck ones; calls nothing itself."""
    return outbox_recover().summary()
