"""Time budgets as code: the worst case of every slow operation, and who must fit it.

A budget is a contract (the seed's first lesson): a retry loop inside a function with a
30-second budget has to be *calculated*, not estimated. Each operation below computes its
worst case from the very settings its client runs with and returns the arithmetic as text,
so the system check (outbox/checks.py, `outbox.E001`) can show *why* something does not fit.

The seed's configuration, in this arithmetic (render client with in-call retries):

    health 5.0 s + 4 x render 10.0 s + backoff 2.0+4.0+8.0 s = 59.0 s

The seed's author wrote "roughly 46 s"; the sum of its own terms is 59 s before jitter, and
66 s if the +50 % jitter it describes is applied on top of 2/4/8 s. We report 59 s for that
configuration because our client's pauses use full jitter (eventdrop.retry.RetryPolicy):
a pause is uniform(0, ceiling), so its worst case *is* the ceiling, never above it. Either
way it is twice the 30 s webhook budget, and it does not fit the dispatcher's 60 s either.

Our defaults: health 3.0 s + 1 x render 10.0 s = 13.0 s per dispatch (the outbox, not the
client, is the retry loop), against the dispatcher's 60 s run.
"""

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import stripe
from django.conf import settings

from recaps.render_client import RenderClientConfig


@dataclass(frozen=True)
class WorstCase:
    seconds: float
    arithmetic: str


def _s(value: float) -> str:
    return f"{value:.1f} s"


def render_dispatch_worst_case(config: RenderClientConfig | None = None) -> WorstCase:
    """One dispatch: the health precheck, then `attempts` render calls with pauses between.

    Each call is capped by its total deadline (recaps/render_client.py streams the body and
    stops there), so a call's worst case is that deadline, whatever its connect and read
    timeouts are. The pause before attempt n+1 is at most RetryPolicy.ceiling(n).
    """
    c = config or RenderClientConfig.from_settings()
    pauses = [c.backoff.ceiling(n) for n in range(1, c.attempts)]
    total = c.health.total + c.attempts * c.render.total + sum(pauses)
    terms = [f"health {_s(c.health.total)}", f"{c.attempts} x render {_s(c.render.total)}"]
    if pauses:
        terms.append("backoff " + "+".join(f"{p:.1f}" for p in pauses) + " s")
    return WorstCase(total, " + ".join(terms) + f" = {_s(total)}")


def render_status_worst_case(config: RenderClientConfig | None = None) -> WorstCase:
    """One render-status check (a lost callback): a single call capped by its total
    deadline (RenderClient.render_status; no health precheck, no in-call retry)."""
    c = config or RenderClientConfig.from_settings()
    total = c.status.total
    return WorstCase(total, f"status {_s(total)} = {_s(total)}")


def stripe_call_worst_case() -> WorstCase:
    """Any one call through eventdrop.stripe_api.stripe_client (checkout, reconciliation).

    Per try: connect + read timeout (`requests` buffers Stripe's small JSON answer; its read
    timeout is the silence allowed between bytes, which Stripe's API never drips). The SDK
    retries timeouts, connection errors, 409 and 5xx up to max_network_retries times and
    sleeps min(INITIAL_DELAY x 2^(n-1), MAX_DELAY) x uniform(0.5, 1), at least INITIAL_DELAY,
    before retry n: its worst case is max(INITIAL_DELAY, min(INITIAL_DELAY x 2^(n-1), MAX_DELAY)).
    """
    per_try = settings.STRIPE_CONNECT_TIMEOUT_SECONDS + settings.STRIPE_READ_TIMEOUT_SECONDS
    retries = settings.STRIPE_MAX_NETWORK_RETRIES
    initial, cap = stripe.HTTPClient.INITIAL_DELAY, stripe.HTTPClient.MAX_DELAY
    sleeps = [max(initial, min(initial * 2 ** (n - 1), cap)) for n in range(1, retries + 1)]
    total = (1 + retries) * per_try + sum(sleeps)
    arithmetic = (
        f"{1 + retries} x (connect {_s(settings.STRIPE_CONNECT_TIMEOUT_SECONDS)} + read "
        f"{_s(settings.STRIPE_READ_TIMEOUT_SECONDS)})"
    )
    if sleeps:
        arithmetic += " + SDK retry sleep " + "+".join(f"{p:.1f}" for p in sleeps) + " s"
    return WorstCase(total, f"{arithmetic} = {_s(total)}")


_STATEMENT_TIMEOUT = re.compile(r"statement_timeout\s*=\s*(\d+)")


def database_statement_worst_case(database: dict | None = None) -> WorstCase:
    """One statement on the default database: connect, then at most the statement timeout
    (on PostgreSQL it includes lock waits); on SQLite, the busy timeout."""
    database = database or settings.DATABASES["default"]
    options = database.get("OPTIONS", {})
    if "postgresql" in database["ENGINE"]:
        connect = options.get("connect_timeout")
        match = _STATEMENT_TIMEOUT.search(str(options.get("options", "")))
        if connect is None or match is None:
            return WorstCase(math.inf, "no connect_timeout or statement_timeout: unbounded")
        statement = int(match.group(1)) / 1000
        total = float(connect) + statement
        return WorstCase(
            total, f"connect {_s(float(connect))} + statement {_s(statement)} = {_s(total)}"
        )
    busy = float(options.get("timeout", 5))
    return WorstCase(busy, f"SQLite busy timeout {_s(busy)}")


def raw_event_store_worst_case() -> WorstCase:
    """The webhook's store (ingress.services.raw_event_store): one deadline bounds every
    database wait in it, and a connect, or the one reconnect, only starts with a timeout that
    fits what is left of it (eventdrop/db). So the deadline is the whole worst case."""
    seconds = settings.WEBHOOK_STORE_TIMEOUT_SECONDS
    return WorstCase(
        seconds,
        f"store deadline {_s(seconds)} (connect, INSERT and one reconnect all inside it) "
        f"= {_s(seconds)}",
    )


@dataclass(frozen=True)
class GiveUp:
    """When a side effect gives up on transient failures (eventdrop.retry.RetryStrategy):
    after `attempts` charged attempts AND once `horizon_seconds` have passed since its first
    charged failure; the pause before the last attempt is stretched to reach the horizon."""

    attempts: int
    pauses: tuple[float, ...]  # the ceiling of each pause between attempts
    horizon_seconds: float

    @property
    def backoff_seconds(self) -> float:
        return sum(self.pauses)

    @property
    def min_life_seconds(self) -> float:
        """How long a transient failure keeps a row alive, at least."""
        return self.horizon_seconds

    @property
    def arithmetic(self) -> str:
        pauses = "+".join(f"{p:.1f}" for p in self.pauses) or "0.0"
        return (
            f"dead after {self.attempts} charged attempts (OUTBOX_MAX_ATTEMPTS) with pauses "
            f"of at most {pauses} s = {_s(self.backoff_seconds)} between them, the last "
            f"attempt no earlier than the horizon, {_s(self.horizon_seconds)} "
            f"({self.horizon_seconds / 3600:.1f} h, OUTBOX_TRANSIENT_HORIZON_SECONDS) after "
            f"the first charged failure: a transient failure keeps a row alive for at least "
            f"{_s(self.min_life_seconds)}; failures while the render service fails as a "
            f"whole are not charged"
        )


def side_effect_give_up() -> GiveUp:
    from outbox.services import outbox_retry_strategy

    strategy = outbox_retry_strategy()  # ValueError on a setting that cannot work
    policy = strategy.policy
    pauses = tuple(policy.ceiling(n) for n in range(1, policy.max_attempts))
    return GiveUp(policy.max_attempts, pauses, strategy.horizon_seconds)


def raw_event_archive_day_worst_case() -> WorstCase:
    """Archiving one day before its partition is dropped (ingress/archive.py), with the
    configured sources: per source an upload and its read-back, then the manifest's two. Each
    call: RAW_EVENT_ARCHIVE_MAX_ATTEMPTS tries of connect + read timeout, with botocore's
    standard-mode pauses between them (at most min(20, 2^(n-1)) + 5 s before retry n)."""
    from ingress.archive import ArchiveClientConfig, archive_enabled, calls_per_day
    from ingress.sources import all_sources

    if not archive_enabled():
        return WorstCase(0.0, "archive off (RAW_EVENT_ARCHIVE_ENABLED) = 0.0 s")
    c = ArchiveClientConfig.from_settings()
    calls = calls_per_day(sum(1 for source in all_sources().values() if source.enabled))
    per_call = c.call_worst_case_seconds()
    pauses = "+".join(f"{p:.1f}" for p in c.retry_pauses()) or "0.0"
    total = calls * per_call
    return WorstCase(
        total,
        f"{calls} S3 calls x ({c.max_attempts} x (connect {_s(c.connect_timeout)} + read "
        f"{_s(c.read_timeout)}) + retry pauses {pauses} s = {_s(per_call)}) = {_s(total)}",
    )


OPERATIONS: dict[str, Callable[[], WorstCase]] = {
    "render.dispatch": render_dispatch_worst_case,
    "render.status": render_status_worst_case,
    "stripe.checkout_session": stripe_call_worst_case,
    "database.statement": database_statement_worst_case,
    "ingress.raw_event_store": raw_event_store_worst_case,
    "ingress.archive_day": raw_event_archive_day_worst_case,
}


@dataclass(frozen=True)
class Caller:
    """Code with a time budget that performs `operation` synchronously, `times` times."""

    name: str
    budget_setting: str
    operation: str
    times: int = 1


# Who waits for what. A new synchronous use of a slow operation is added here, and the
# check then holds it against its caller's budget before the code can ship.
CALLERS: list[Caller] = [
    # A run claims a row only while what is left covers one worst-case dispatch.
    Caller("outbox dispatcher run", "OUTBOX_DISPATCH_BUDGET_SECONDS", "render.dispatch"),
    # Likewise a render-check run (outbox/render_checks.py) asks only while one check fits.
    Caller("render check run", "RENDER_CHECK_BUDGET_SECONDS", "render.status"),
    Caller("recap purchase request", "RECAP_PURCHASE_BUDGET_SECONDS", "stripe.checkout_session"),
    # The receive path is one INSERT; nothing slow may ever join it.
    Caller("webhook receive request", "WEBHOOK_REQUEST_BUDGET_SECONDS", "ingress.raw_event_store"),
    # A maintenance run starts a day's archive only while its worst case fits what is left.
    Caller(
        "partition maintenance run", "RAW_EVENT_PARTITIONS_BUDGET_SECONDS", "ingress.archive_day"
    ),
]


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
            f"{_s(self.budget)} budget of the {self.caller.name} ({self.caller.budget_setting})."
        )


def budget_violations(callers: list[Caller] | None = None) -> list[BudgetViolation]:
    violations = []
    for caller in CALLERS if callers is None else callers:
        budget = float(getattr(settings, caller.budget_setting))
        worst = OPERATIONS[caller.operation]()
        if caller.times * worst.seconds > budget:
            violations.append(BudgetViolation(caller=caller, budget=budget, worst=worst))
    return violations
