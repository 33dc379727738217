"""Flow 2, second half: the deliveries the inbox creates, one per (event, handler), and how
they run (docs/flows.md, "Deliveries"; the one queue they are rows of: kernel/queue.py).

- create.py: the deliveries of a settled event, and running them at settle;
- ordering.py: ordered handlers, one delivery per key at a time;
- run.py: claim, run, record, and the claims of the dead;
- holds.py: pauses, resumes, replays and re-arms by an operator;
- statements.py: their SQL.
"""

from ingress.deliveries.create import (
    SettleRunRaised,
    deliveries_for_event,
    deliveries_run_at_settle,
    deliveries_runnable_at_settle,
    deliveries_settle_run_rest,
)
from ingress.deliveries.holds import (
    ReplayArming,
    deliveries_arm_for_replay,
    deliveries_hold,
    deliveries_rearm_dead,
    deliveries_release,
)
from ingress.deliveries.ordering import ORDERING_LOCK_CLASS
from ingress.deliveries.run import (
    DATABASE_UNAVAILABLE,
    DELIVERY_WORKER_DIED_ERROR,
    HANDLER_MISSING,
    KEY_MISSING_RECHECK_SECONDS,
    deliveries_claim,
    deliveries_rearm_orphaned,
    deliveries_run_due,
    delivery_retry_policy,
    delivery_retry_strategy,
)

__all__ = [
    "DATABASE_UNAVAILABLE",
    "DELIVERY_WORKER_DIED_ERROR",
    "HANDLER_MISSING",
    "KEY_MISSING_RECHECK_SECONDS",
    "ORDERING_LOCK_CLASS",
    "ReplayArming",
    "SettleRunRaised",
    "deliveries_arm_for_replay",
    "deliveries_claim",
    "deliveries_for_event",
    "deliveries_hold",
    "deliveries_rearm_dead",
    "deliveries_rearm_orphaned",
    "deliveries_release",
    "deliveries_run_at_settle",
    "deliveries_run_due",
    "deliveries_runnable_at_settle",
    "deliveries_settle_run_rest",
    "delivery_retry_policy",
    "delivery_retry_strategy",
]
