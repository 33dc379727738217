"""django-q2 entry points (thin: they call ingress/inbox.py)."""

import time

from django.conf import settings

from ingress.inbox import inbox_run_once


def inbox_pass() -> dict:
    """The scheduled safety net behind `process_inbox`: drain until idle or out of budget."""
    deadline = time.monotonic() + settings.INBOX_SCHEDULED_PASS_BUDGET_SECONDS
    totals = {"verified": 0, "delivered": 0, "rearmed": 0, "passes": 0}
    while time.monotonic() < deadline:
        result = inbox_run_once()
        totals["passes"] += 1
        totals["verified"] += result.verified
        totals["delivered"] += result.delivered
        totals["rearmed"] += result.rearmed
        if result.idle:
            break
    return totals
