"""Every recurring django-q2 task, in one place. `manage.py ensure_schedules` writes them.

Each entry: (name, dotted function path, schedule type, minutes for MINUTES schedules).
Apps add their own entries here rather than creating Schedule rows ad hoc, so a fresh
deployment (`release:` in the Procfile) always has the complete set.
"""

from django_q.models import Schedule

SCHEDULES: list[tuple[str, str, str, int | None]] = [
    # Safety net behind the long-running `process_inbox` worker (Flow 2).
    ("ingress.inbox_pass", "ingress.tasks.inbox_pass", Schedule.MINUTES, 1),
    (
        "ingress.raw_event_partitions",
        "ingress.partitions.raw_event_partitions_maintain",
        Schedule.MINUTES,
        60,
    ),
    # Flow 3: the recap outbox dispatcher (one budgeted run) and the nightly recovery.
    ("outbox.dispatch_side_effects", "outbox.tasks.dispatch_side_effects", Schedule.MINUTES, 2),
    ("outbox.recover_recaps", "outbox.tasks.recover_recaps", Schedule.DAILY, None),
    # Nightly reconciliation against the providers' own lists (drift, backfill, redelivery).
    (
        "ingress.reconcile_stripe",
        "ingress.reconcile.tasks.reconcile_stripe_nightly",
        Schedule.DAILY,
        None,
    ),
    (
        "ingress.reconcile_github",
        "ingress.reconcile.tasks.reconcile_github_nightly",
        Schedule.DAILY,
        None,
    ),
]
