"""Time budgets of a reconciliation run: every call's worst case, and a clock that spends them.

A run makes one provider call per page (and, for GitHub, one per redelivery). Each call's
worst case is computed from the settings its client runs with:

- Stripe: the SDK's RequestsClient with (connect, read) timeouts and max_network_retries —
  the arithmetic of outbox.budgets.stripe_call_worst_case, which holds for every call of
  that client (defaults: 2 x (2.0 + 4.0) s + 0.5 s SDK retry sleep = 12.5 s).
- GitHub: `requests` with (connect, read) timeouts, GITHUB_MAX_RETRIES retries of a GET on
  timeouts, connection errors and 5xx, with capped exponential backoff and full jitter
  (defaults: 2 x (3.0 + 10.0) s + 0.5 s = 26.5 s). A redelivery request (POST) is never
  retried within a run: GitHub's attempts endpoint is not idempotent, and the next run asks
  again for whatever is still missing.

`RunClock.require` is called before every call: a run only starts a call while what is left
of RECONCILE_RUN_BUDGET_SECONDS covers that call's worst case, so a run ends within its
budget however slow the provider is, and stops `incomplete` instead of being killed. The
nightly task additionally needs the budget below django-q2's task timeout.
"""

import time
from collections.abc import Callable

from django.conf import settings

from eventdrop.retry import RetryPolicy
from ingress.reconcile.errors import (
    BUDGET_OVER_Q_TIMEOUT,
    BUDGET_UNFIT,
    BUDGET_USED,
    ReconcileFailed,
    ReconcileStopped,
)
from outbox.budgets import WorstCase, stripe_call_worst_case

# Pauses between GitHub GET retries (the retry count is GITHUB_MAX_RETRIES).
GITHUB_RETRY_BASE_SECONDS = 0.5
GITHUB_RETRY_CAP_SECONDS = 4.0


def github_retry_policy() -> RetryPolicy:
    return RetryPolicy(
        max_attempts=1 + settings.GITHUB_MAX_RETRIES,
        base_seconds=GITHUB_RETRY_BASE_SECONDS,
        cap_seconds=GITHUB_RETRY_CAP_SECONDS,
    )


def github_call_worst_case() -> WorstCase:
    """attempts x (connect + read) + the longest pauses between them (full jitter: ceiling)."""
    policy = github_retry_policy()
    connect, read = settings.GITHUB_CONNECT_TIMEOUT_SECONDS, settings.GITHUB_READ_TIMEOUT_SECONDS
    pauses = [policy.ceiling(n) for n in range(1, policy.max_attempts)]
    total = policy.max_attempts * (connect + read) + sum(pauses)
    arithmetic = f"{policy.max_attempts} x (connect {connect:.1f} s + read {read:.1f} s)"
    if pauses:
        arithmetic += " + backoff " + "+".join(f"{p:.1f}" for p in pauses) + " s"
    return WorstCase(total, f"{arithmetic} = {total:.1f} s")


CALL_WORST_CASES: dict[str, Callable[[], WorstCase]] = {
    "stripe": stripe_call_worst_case,
    "github": github_call_worst_case,
}


def budget_fit_check(*, provider: str, scheduled: bool) -> None:
    """Refuse a run that could never make a call, or that django-q2 would kill mid-way."""
    budget = settings.RECONCILE_RUN_BUDGET_SECONDS
    worst = CALL_WORST_CASES[provider]()
    if worst.seconds > budget:
        raise ReconcileFailed(
            BUDGET_UNFIT.format(
                operation=provider, arithmetic=worst.arithmetic, budget=float(budget)
            )
        )
    q_timeout = settings.Q_CLUSTER.get("timeout")
    if scheduled and q_timeout is not None and budget >= q_timeout:
        raise ReconcileFailed(BUDGET_OVER_Q_TIMEOUT.format(budget=float(budget), timeout=q_timeout))


class RunClock:
    """What is left of a run's budget, on a monotonic clock."""

    def __init__(
        self, budget_seconds: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.budget = float(budget_seconds)
        self._clock = clock
        self._deadline = clock() + self.budget

    def remaining(self) -> float:
        return max(self._deadline - self._clock(), 0.0)

    def require(self, provider: str) -> None:
        """Raise ReconcileStopped unless one more worst-case call of `provider` fits."""
        worst = CALL_WORST_CASES[provider]()
        remaining = self.remaining()
        if worst.seconds > remaining:
            raise ReconcileStopped(
                BUDGET_USED.format(
                    remaining=remaining, budget=self.budget, operation=provider, worst=worst.seconds
                )
            )
