"""Time budgets as code: the worst case of every slow operation, and the clock that spends them.

A budget is a contract (the seed's first lesson): a retry loop inside a function with a
30-second budget has to be *calculated*, not estimated. Every worst case below is computed
from the very settings (or client configuration) its call runs with and carries its
arithmetic as text (`WorstCase`, one formatter), so a system check can show *why* something
does not fit. Next to kernel/retry.py because the pauses between attempts are that
module's RetryPolicy ceilings: full jitter, so a pause's worst case *is* its ceiling.

What is here, by name:

- the render service (outbox/render_client.py): `render_dispatch_worst_case`,
  `render_status_worst_case`;
- Stripe (kernel/stripe_api.py): `stripe_call_worst_case`;
- the database: `database_statement_worst_case`; the webhook's store:
  `raw_event_store_worst_case`; a webhook from its connection to its answer, against its
  source's budget: `webhook_budget_seconds`, `webhook_receive_worst_case`; archiving a day
  of raw events: `archive_day_worst_case`;
- reconciliation (ingress/reconcile/): `github_call_worst_case`, `reconcile_call_worst_case`,
  `reconcile_budget_problem`;
- the give-up arithmetic of side effects and deliveries: `give_up_arithmetic`; a delivery
  batch's run: `delivery_batch_worst_case`;
- `Caller` / `budget_violations`: who waits for what (the table itself is outbox/checks.py,
  `outbox.E001`, which can name the outbox's and ingress's configurations);
- `BudgetClock`: the one clock a budgeted run spends (dispatcher, render checks,
  reconciliation): it starts a call only while what is left covers that call's worst case.

This module imports no app: the apps pass their client configuration in.

The seed's configuration, in this arithmetic (render client with in-call retries):

    health 5.0 s + 4 x render 10.0 s + backoff 2.0+4.0+8.0 s = 59.0 s

The seed's author wrote "roughly 46 s"; the sum of its own terms is 59 s before jitter, and
66 s if the +50 % jitter it describes is applied on top of 2/4/8 s. Either way it is twice
the 30 s webhook budget, and it does not fit the dispatcher's 60 s either. Our defaults:
health 3.0 s + 1 x render 10.0 s = 13.0 s per dispatch (the outbox, not the client, is the
retry loop), against the dispatcher's 60 s run.
"""

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import stripe
from django.conf import settings

from kernel.errors import EventDropError
from kernel.retry import RetryPolicy, RetryStrategy

RECONCILE_BUDGET_UNFIT = (
    "{operation} worst case {arithmetic} does not fit the run budget of {budget:.1f} s "
    "(RECONCILE_RUN_BUDGET_SECONDS): no call could ever be made."
)
RECONCILE_BUDGET_OVER_Q_TIMEOUT = (
    "RECONCILE_RUN_BUDGET_SECONDS ({budget:.1f} s) must stay below django-q2's task timeout "
    "({timeout:g} s), or the nightly run is killed mid-way and left `running`."
)
BUDGET_USED = (
    "Stopped: {remaining:.1f} s left of the {budget:.1f} s run budget ({setting}) cannot cover "
    "another {operation} call (worst case {worst:.1f} s)."
)

# Pauses between GitHub GET retries (the retry count is GITHUB_MAX_RETRIES).
GITHUB_RETRY_BASE_SECONDS = 0.5
GITHUB_RETRY_CAP_SECONDS = 4.0


# --- the one formatter ------------------------------------------------------------------------


def seconds_text(value: float) -> str:
    return f"{value:.1f} s"


def pauses_text(pauses: Sequence[float]) -> str:
    """ "2.0+4.0+8.0 s": the ceilings of the pauses between attempts."""
    return "+".join(f"{p:.1f}" for p in pauses) + " s"


@dataclass(frozen=True)
class WorstCase:
    seconds: float
    arithmetic: str

    @classmethod
    def of(cls, terms: Sequence[str], total: float) -> "WorstCase":
        """The terms joined by " + ", then " = <total>"."""
        return cls(total, " + ".join(terms) + f" = {seconds_text(total)}")

    @property
    def terms(self) -> str:
        """The arithmetic without its total (to embed in a larger sum)."""
        return self.arithmetic.rsplit(" = ", 1)[0]


def _attempts_term(attempts: int, connect: float, read: float) -> str:
    return f"{attempts} x (connect {seconds_text(connect)} + read {seconds_text(read)})"


# --- the render service -----------------------------------------------------------------------


class _Total(Protocol):
    @property
    def total(self) -> float: ...


class RenderLimits(Protocol):
    """What the arithmetic needs of outbox.render_client.RenderClientConfig."""

    @property
    def health(self) -> _Total: ...
    @property
    def render(self) -> _Total: ...
    @property
    def status(self) -> _Total: ...
    @property
    def attempts(self) -> int: ...
    @property
    def backoff(self) -> RetryPolicy: ...


def render_dispatch_worst_case(limits: RenderLimits) -> WorstCase:
    """One dispatch: the health precheck, then `attempts` render calls with pauses between.

    Each call is capped by its total deadline (outbox/render_client.py streams the body and
    stops there), so a call's worst case is that deadline, whatever its connect and read
    timeouts are. The pause before attempt n+1 is at most RetryPolicy.ceiling(n).
    """
    pauses = [limits.backoff.ceiling(n) for n in range(1, limits.attempts)]
    total = limits.health.total + limits.attempts * limits.render.total + sum(pauses)
    terms = [
        f"health {seconds_text(limits.health.total)}",
        f"{limits.attempts} x render {seconds_text(limits.render.total)}",
    ]
    if pauses:
        terms.append(f"backoff {pauses_text(pauses)}")
    return WorstCase.of(terms, total)


def render_status_worst_case(limits: RenderLimits) -> WorstCase:
    """One render-status check (a lost callback): a single call capped by its total
    deadline (RenderClient.render_status; no health precheck, no in-call retry)."""
    total = limits.status.total
    return WorstCase.of([f"status {seconds_text(total)}"], total)


# --- Stripe, the database, the webhook's store -------------------------------------------------


def stripe_call_worst_case() -> WorstCase:
    """Any one call through kernel.stripe_api.stripe_client (checkout, reconciliation).

    Per try: connect + read timeout (`requests` buffers Stripe's small JSON answer; its read
    timeout is the silence allowed between bytes, which Stripe's API never drips). The SDK
    retries timeouts, connection errors, 409 and 5xx up to max_network_retries times and
    sleeps min(INITIAL_DELAY x 2^(n-1), MAX_DELAY) x uniform(0.5, 1), at least INITIAL_DELAY,
    before retry n: its worst case is max(INITIAL_DELAY, min(INITIAL_DELAY x 2^(n-1), MAX_DELAY)).
    """
    connect, read = settings.STRIPE_CONNECT_TIMEOUT_SECONDS, settings.STRIPE_READ_TIMEOUT_SECONDS
    retries = settings.STRIPE_MAX_NETWORK_RETRIES
    initial, cap = stripe.HTTPClient.INITIAL_DELAY, stripe.HTTPClient.MAX_DELAY
    sleeps = [max(initial, min(initial * 2 ** (n - 1), cap)) for n in range(1, retries + 1)]
    total = (1 + retries) * (connect + read) + sum(sleeps)
    terms = [_attempts_term(1 + retries, connect, read)]
    if sleeps:
        terms.append(f"SDK retry sleep {pauses_text(sleeps)}")
    return WorstCase.of(terms, total)


_STATEMENT_TIMEOUT = re.compile(r"statement_timeout\s*=\s*(\d+)")


def database_statement_worst_case(database: Mapping[str, Any] | None = None) -> WorstCase:
    """One statement on the default database: connect, then at most the statement timeout
    (which includes lock waits)."""
    database = database or settings.DATABASES["default"]
    options = database.get("OPTIONS", {})
    connect = options.get("connect_timeout")
    match = _STATEMENT_TIMEOUT.search(str(options.get("options", "")))
    if connect is None or match is None:
        return WorstCase(math.inf, "no connect_timeout or statement_timeout: unbounded")
    statement = int(match.group(1)) / 1000
    return WorstCase.of(
        [f"connect {seconds_text(float(connect))}", f"statement {seconds_text(statement)}"],
        float(connect) + statement,
    )


def raw_event_store_worst_case() -> WorstCase:
    """The webhook's store (ingress.services): one deadline bounds every database wait in it,
    and a connect, or the one reconnect, only starts with a timeout that fits what is left of
    it (kernel/db). So the deadline is the whole worst case."""
    seconds = settings.WEBHOOK_STORE_TIMEOUT_SECONDS
    return WorstCase.of(
        [
            f"store deadline {seconds_text(seconds)} (the wait in the queue or for a "
            "connection, the INSERT and one reconnect all inside it)"
        ],
        seconds,
    )


def webhook_budget_seconds(timeout_seconds: float | None) -> float:
    """A webhook source's request budget: its sender's timeout (`Source.timeout_seconds`;
    None when it publishes none), never past the route's WEBHOOK_REQUEST_BUDGET_SECONDS."""
    route = float(settings.WEBHOOK_REQUEST_BUDGET_SECONDS)
    return route if timeout_seconds is None else min(float(timeout_seconds), route)


def webhook_receive_worst_case(*, budget: float, header: float) -> WorstCase:
    """One webhook on the production server, from its connection to its answer.

    The server reads the head within `header` (its read timeout); the receive path then has
    one deadline, what `budget` leaves after the header, for the body read (within
    WEBHOOK_BODY_READ_TIMEOUT_SECONDS), the wait in the store's queue and the store (within
    WEBHOOK_STORE_TIMEOUT_SECONDS) together (ingress/asgi.py). So a source whose budget is
    shorter than those bounds cuts them, and one that the header leaves nothing of cannot be
    served at all.
    """
    body = settings.WEBHOOK_BODY_READ_TIMEOUT_SECONDS
    store = settings.WEBHOOK_STORE_TIMEOUT_SECONDS
    left = max(budget - header, 0.0)
    return WorstCase.of(
        [
            f"header {seconds_text(header)} (WEB_HEADER_READ_TIMEOUT_SECONDS)",
            f"min(body read {seconds_text(body)} (WEBHOOK_BODY_READ_TIMEOUT_SECONDS) + queue "
            f"wait and store {seconds_text(store)} (WEBHOOK_STORE_TIMEOUT_SECONDS), the "
            f"{seconds_text(left)} the budget leaves)",
        ],
        header + min(body + store, left),
    )


# --- archiving a day of raw events before its partition is dropped ---------------------------


class ArchiveLimits(Protocol):
    """What the arithmetic needs of ingress.archive.ArchiveClientConfig."""

    @property
    def connect_timeout(self) -> float: ...
    @property
    def read_timeout(self) -> float: ...
    @property
    def max_attempts(self) -> int: ...
    def retry_pauses(self) -> list[float]: ...
    def call_worst_case_seconds(self) -> float: ...


def archive_day_worst_case(limits: ArchiveLimits | None, *, calls: int) -> WorstCase:
    """Archiving one day (ingress/archive.py): `calls` S3 calls (per source an upload and its
    read-back, then the manifest's two), each RAW_EVENT_ARCHIVE_MAX_ATTEMPTS tries of
    connect + read timeout with botocore's standard-mode pauses between them. `limits` None:
    the archive is off."""
    if limits is None:
        return WorstCase(0.0, f"archive off (RAW_EVENT_ARCHIVE_ENABLED) = {seconds_text(0.0)}")
    per_call = limits.call_worst_case_seconds()
    pauses = pauses_text(limits.retry_pauses() or [0.0])
    total = calls * per_call
    attempts = _attempts_term(limits.max_attempts, limits.connect_timeout, limits.read_timeout)
    return WorstCase.of(
        [f"{calls} S3 calls x ({attempts} + retry pauses {pauses} = {seconds_text(per_call)})"],
        total,
    )


# --- reconciliation -------------------------------------------------------------------------


def github_retry_policy() -> RetryPolicy:
    """The GitHub client's GET retries (ingress/reconcile/github.py), whose worst case is below."""
    return RetryPolicy(
        max_attempts=1 + settings.GITHUB_MAX_RETRIES,
        base_seconds=GITHUB_RETRY_BASE_SECONDS,
        cap_seconds=GITHUB_RETRY_CAP_SECONDS,
    )


def github_call_worst_case() -> WorstCase:
    """attempts x (connect + read) + the longest pauses between them (full jitter: ceiling).
    A redelivery request (POST) is never retried within a run (GitHub's attempts endpoint is
    not idempotent), so this GET worst case bounds it too."""
    policy = github_retry_policy()
    connect, read = settings.GITHUB_CONNECT_TIMEOUT_SECONDS, settings.GITHUB_READ_TIMEOUT_SECONDS
    pauses = [policy.ceiling(n) for n in range(1, policy.max_attempts)]
    total = policy.max_attempts * (connect + read) + sum(pauses)
    terms = [_attempts_term(policy.max_attempts, connect, read)]
    if pauses:
        terms.append(f"backoff {pauses_text(pauses)}")
    return WorstCase.of(terms, total)


RECONCILE_CALL_WORST_CASES: dict[str, Callable[[], WorstCase]] = {
    "stripe": stripe_call_worst_case,
    "github": github_call_worst_case,
}


def reconcile_call_worst_case(provider: str) -> WorstCase:
    return RECONCILE_CALL_WORST_CASES[provider]()


def reconcile_budget_problem(*, provider: str, scheduled: bool) -> str | None:
    """Why a reconciliation run of `provider` could never make a call, or would be killed by
    django-q2 mid-way (scheduled runs only); None when it fits."""
    budget = float(settings.RECONCILE_RUN_BUDGET_SECONDS)
    worst = reconcile_call_worst_case(provider)
    if worst.seconds > budget:
        return RECONCILE_BUDGET_UNFIT.format(
            operation=provider, arithmetic=worst.arithmetic, budget=budget
        )
    q_timeout = q_task_timeout()
    if scheduled and q_timeout is not None and budget >= q_timeout:
        return RECONCILE_BUDGET_OVER_Q_TIMEOUT.format(budget=budget, timeout=q_timeout)
    return None


def q_task_timeout() -> float | None:
    """django-q2's task timeout (Q_CLUSTER["timeout"], seconds), None when it has none."""
    timeout = settings.Q_CLUSTER.get("timeout")
    if isinstance(timeout, int | float | str):
        return float(timeout)
    return None


# --- the give-up arithmetic of the retry machines (side effects, deliveries) ----------------


@dataclass(frozen=True)
class GiveUp:
    """When a row gives up on its own failures (kernel.retry.RetryStrategy): after
    `attempts` charged attempts AND once `horizon_seconds` have passed since its first
    charged failure; the pause before the last attempt is stretched to reach the horizon.
    Failures that are not about the row (the service, its deploy, our database) are never
    charged, so they never bring it closer. The setting names make the arithmetic say which
    retry machine it is."""

    attempts: int
    pauses: tuple[float, ...]  # the ceiling of each pause between attempts
    horizon_seconds: float
    attempts_setting: str = "OUTBOX_MAX_ATTEMPTS"
    horizon_setting: str = "OUTBOX_TRANSIENT_HORIZON_SECONDS"

    @property
    def backoff_seconds(self) -> float:
        return sum(self.pauses)

    @property
    def min_life_seconds(self) -> float:
        """How long a failure of its own keeps a row alive, at least."""
        return self.horizon_seconds

    @property
    def arithmetic(self) -> str:
        return (
            f"dead after {self.attempts} charged attempts ({self.attempts_setting}) with pauses "
            f"of at most {pauses_text(self.pauses or (0.0,))} = "
            f"{seconds_text(self.backoff_seconds)} between them, the last attempt no earlier "
            f"than the horizon, {seconds_text(self.horizon_seconds)} "
            f"({self.horizon_seconds / 3600:.1f} h, {self.horizon_setting}) after "
            f"the first charged failure: a transient failure keeps a row alive for at least "
            f"{seconds_text(self.min_life_seconds)}; answers about the service, its deploy or "
            f"our database are never charged"
        )


def give_up_arithmetic(
    strategy: RetryStrategy,
    *,
    attempts_setting: str = "OUTBOX_MAX_ATTEMPTS",
    horizon_setting: str = "OUTBOX_TRANSIENT_HORIZON_SECONDS",
) -> GiveUp:
    policy = strategy.policy
    pauses = tuple(policy.ceiling(n) for n in range(1, policy.max_attempts))
    return GiveUp(
        policy.max_attempts, pauses, strategy.horizon_seconds, attempts_setting, horizon_setting
    )


def statement_timeout_seconds(database: Mapping[str, Any] | None = None) -> float:
    """The default database's statement_timeout (seconds; inf when it has none)."""
    database = database or settings.DATABASES["default"]
    match = _STATEMENT_TIMEOUT.search(str(database.get("OPTIONS", {}).get("options", "")))
    return int(match.group(1)) / 1000 if match else math.inf


def delivery_batch_worst_case(batch_size: int) -> WorstCase:
    """How long one claimed batch of deliveries may run: each handler's statement capped by
    the statement timeout (a batch's transaction is open: no connect)."""
    statement = statement_timeout_seconds()
    return WorstCase.of(
        [f"{batch_size} deliveries (INBOX_BATCH_SIZE) x statement {seconds_text(statement)}"],
        batch_size * statement,
    )


# --- who waits for what ----------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """Code with a time budget that performs `operation` synchronously, `times` times."""

    name: str
    budget_setting: str
    operation: str
    times: int = 1


@dataclass(frozen=True)
class BudgetViolation:
    caller: Caller
    budget: float
    worst: WorstCase

    @property
    def message(self) -> str:
        times = f"{self.caller.times} x " if self.caller.times != 1 else ""
        return (
            f"{self.caller.operation} worst case {times}{self.worst.arithmetic} exceeds the "
            f"{seconds_text(self.budget)} budget of the {self.caller.name} "
            f"({self.caller.budget_setting})."
        )


def budget_violations(
    callers: Sequence[Caller], operations: Mapping[str, Callable[[], WorstCase]]
) -> list[BudgetViolation]:
    violations = []
    for caller in callers:
        budget = float(getattr(settings, caller.budget_setting))
        worst = operations[caller.operation]()
        if caller.times * worst.seconds > budget:
            violations.append(BudgetViolation(caller=caller, budget=budget, worst=worst))
    return violations


# --- the one clock ---------------------------------------------------------------------------


class BudgetExhausted(EventDropError):
    """What is left of a run's budget cannot cover one more worst-case call."""


class BudgetClock:
    """What is left of a run's budget, on a monotonic clock (injectable for tests).

    A run asks before every call: `fits(worst)` (or `require`, which raises `exhausted`, a
    subclass of EventDropError the caller picks so its own error handling applies), and
    bounds the call with `call_deadline(worst)`. So a run ends within its budget however
    slow the other side is, and stops instead of being killed."""

    def __init__(
        self,
        budget_seconds: float,
        *,
        setting: str = "",
        clock: Callable[[], float] = time.monotonic,
        exhausted: type[EventDropError] = BudgetExhausted,
    ) -> None:
        self.budget = float(budget_seconds)
        self.setting = setting
        self.exhausted = exhausted
        self._clock = clock
        self.started = clock()
        self.deadline = self.started + self.budget

    def now(self) -> float:
        return self._clock()

    def elapsed(self) -> float:
        return self._clock() - self.started

    def remaining(self) -> float:
        return max(self.deadline - self._clock(), 0.0)

    def fits(self, worst_seconds: float, *, times: int = 1) -> bool:
        """Would `times` more calls of this worst case end within the budget?"""
        return self.deadline - self._clock() >= times * worst_seconds

    def how_many(self, worst_seconds: float) -> int:
        """How many more calls of this worst case fit (0 for a non-positive worst case)."""
        if worst_seconds <= 0:
            return 0
        return max(int((self.deadline - self._clock()) // worst_seconds), 0)

    def call_deadline(self, worst_seconds: float) -> float:
        """The deadline (on this clock) of a call starting now: its worst case, or the run's
        end if that comes first."""
        return min(self._clock() + worst_seconds, self.deadline)

    def require(self, operation: str, worst: WorstCase) -> None:
        """Raise `exhausted` unless one more `operation` call of this worst case fits."""
        remaining = self.remaining()
        if worst.seconds > remaining:
            raise self.exhausted(
                BUDGET_USED.format(
                    remaining=remaining,
                    budget=self.budget,
                    setting=self.setting or "its budget",
                    operation=operation,
                    worst=worst.seconds,
                )
            )
