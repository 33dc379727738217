"""System checks: time budgets (outbox.E001-E003). `manage.py check` fails on them.

The arithmetic is in outbox/budgets.py; these checks only hold it against the budgets.
"""

from django.conf import settings
from django.core import checks

from outbox.budgets import budget_violations


@checks.register()
def check_time_budgets(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = [
        checks.Error(
            violation.message,
            hint=(
                f"Lower the timeouts or retries behind {violation.caller.operation}, or move "
                "the call out of that path (an outbox row instead of a call)."
            ),
            id="outbox.E001",
        )
        for violation in budget_violations()
    ]
    budget = settings.OUTBOX_DISPATCH_BUDGET_SECONDS
    q_timeout = settings.Q_CLUSTER.get("timeout")
    if q_timeout is not None and q_timeout <= budget:
        messages.append(
            checks.Error(
                f"django-q2 kills a task after {q_timeout} s (Q_CLUSTER timeout), inside the "
                f"dispatcher's {budget:.1f} s budget: runs would die mid-dispatch and leave "
                "rows processing until they go stale.",
                hint="Raise Q_TIMEOUT above OUTBOX_DISPATCH_BUDGET_SECONDS.",
                id="outbox.E002",
            )
        )
    stale = settings.OUTBOX_STALE_PROCESSING_SECONDS
    if stale <= budget:
        messages.append(
            checks.Error(
                f"OUTBOX_STALE_PROCESSING_SECONDS ({stale} s) must exceed the dispatcher's "
                f"{budget:.1f} s budget: a live dispatch would be re-armed and run twice.",
                id="outbox.E003",
            )
        )
    return messages
