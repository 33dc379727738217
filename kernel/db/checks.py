"""System checks for the webhook store's database bounds (eventdrop.E001); the arithmetic
against the request budget is outbox.E001 (kernel/budgets.py, `ingress.raw_event_store`)."""

from django.conf import settings
from django.core import checks

from kernel.db.postgresql.base import LIBPQ_MIN_CONNECT_TIMEOUT_SECONDS


@checks.register()
def check_webhook_store_deadline(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """A web thread without a connection must be able to open one inside the store deadline:
    a connect only starts while libpq's shortest connect timeout (2 s) fits what is left."""
    seconds = settings.WEBHOOK_STORE_TIMEOUT_SECONDS
    if seconds > LIBPQ_MIN_CONNECT_TIMEOUT_SECONDS:
        return []
    return [
        checks.Error(
            f"WEBHOOK_STORE_TIMEOUT_SECONDS is {seconds:.1f} s: a webhook that needs a new "
            f"database connection could never open one (libpq waits at least "
            f"{LIBPQ_MIN_CONNECT_TIMEOUT_SECONDS} s), so every such webhook would be a 503.",
            hint=f"Set it above {LIBPQ_MIN_CONNECT_TIMEOUT_SECONDS} s (default 5).",
            id="eventdrop.E001",
        )
    ]

