"""Every recurring django-q2 task, in one place. `manage.py ensure_schedules` writes them.

Apps add their own entries here rather than creating Schedule rows ad hoc, so a fresh
deployment (`release:` in the Procfile) always has the complete set.
"""

from dataclasses import dataclass
from datetime import time

from django_q.models import Schedule


@dataclass(frozen=True)
class Recurring:
    name: str
    func: str  # dotted path of the task
    schedule_type: str
    minutes: int | None = None  # for Schedule.MINUTES
    # For Schedule.DAILY: the UTC time of the first run; django-q2 then adds a day each
    # time, so nightly jobs stay at night instead of running 24 h after each deploy.
    daily_at: time | None = None


SCHEDULES: list[Recurring] = [
    # Safety net behind the long-running `process_inbox` worker (Flow 2).
    Recurring("ingress.inbox_pass", "ingress.tasks.inbox_pass", Schedule.MINUTES, minutes=1),
    Recurring(
        "ingress.raw_event_partitions",
        "ingress.partitions.raw_event_partitions_maintain",
        Schedule.MINUTES,
        minutes=60,
    ),
    # Bulk jobs (console/jobs/services.py): resume a job whose worker died, measure the replay
    # SLO of finished jobs once their two minutes have passed.
    Recurring(
        "console.bulk_jobs_sweep", "console.tasks.bulk_jobs_sweep", Schedule.MINUTES, minutes=1
    ),
    # Flow 3: the recap outbox dispatcher (one budgeted run) and the nightly recovery.
    Recurring(
        "outbox.dispatch_side_effects",
        "outbox.tasks.dispatch_side_effects",
        Schedule.MINUTES,
        minutes=2,
    ),
    Recurring(
        "outbox.recover_recaps",
        "outbox.tasks.recover_recaps",
        Schedule.DAILY,
        daily_at=time(3, 0),
    ),
    # Nightly reconciliation against the providers' own lists (drift, backfill, redelivery),
    # staggered so the runs do not share the django-q2 workers.
    Recurring(
        "ingress.reconcile_stripe",
        "ingress.reconcile.tasks.reconcile_stripe_nightly",
        Schedule.DAILY,
        daily_at=time(3, 20),
    ),
    Recurring(
        "ingress.reconcile_github",
        "ingress.reconcile.tasks.reconcile_github_nightly",
        Schedule.DAILY,
        daily_at=time(3, 40),
    ),
    # Repeated body-only signatures (ingress/signature_replays.py), answered from GitHub's
    # delivery logs; nothing is asked while none waits.
    Recurring(
        "ingress.signature_questions_github",
        "ingress.reconcile.tasks.signature_questions_github",
        Schedule.MINUTES,
        minutes=5,
    ),
]
