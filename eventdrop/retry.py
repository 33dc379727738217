"""The one retry decision of the project: deliveries (ingress/inbox.py) and side effects
(outbox/) both ask it "retry, when, or give up — and why".

Three pieces, in the spirit of procrastinate's RetryStrategy / RetryDecision:

- `classify(exc) -> Failure`: the ONE classification table (`CLASSIFICATION`, first match
  wins). A domain error declares its own verdict by its base class (the error contract in
  eventdrop/errors.py: PermanentError, DeferredError, ServiceFailure); the table reads that,
  so this kernel module imports no app. It sorts a failure into
    transient  retried with backoff, and *charged* (it counts toward max_attempts);
    permanent  given up at once (the row goes `dead`);
    deferred   not the row's fault and nothing was tried (our own configuration): the row
               is released without being charged.
  Our own database's errors (OperationalError, InterfaceError — deadlocks, serialization
  failures, statement and lock timeouts, a restarted server) are transient, never
  permanent. Anything the table does not name is transient too, and charged: a new error
  source is retried a bounded number of times and then ends `dead`, visibly, with its
  class name ("unclassified:KeyError") — never silently final on its first occurrence.
- `RetryPolicy`: the backoff formula.
- `RetryStrategy.decide(...) -> RetryDecision`: what to do with one failed attempt.

Callers record the decision on their row, fenced on (claimed_at, attempts) with `fenced`,
so a worker whose row was re-armed and claimed again meanwhile cannot overwrite the new run.
"""

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError
from django.db.models import Model, QuerySet

from eventdrop.errors import ClassifiedError, Disposition

_Row = TypeVar("_Row", bound=Model)


@dataclass(frozen=True)
class Failure:
    """One failure, classified."""

    disposition: Disposition
    # Short machine-readable class, stored on the row (last_error_class) and in history.
    error_class: str
    # Seconds the callee asked us to wait (Retry-After), if it did.
    retry_after: float | None = None
    # It says something about the remote service as a whole, not about this row (5xx, 429,
    # timeouts, refused connections): the circuit breaker's input.
    service_failure: bool = False

    @property
    def transient(self) -> bool:
        """Worth another try (transient or deferred)."""
        return self.disposition != Disposition.PERMANENT


def _transient(error_class: str, **kwargs: Any) -> Failure:
    return Failure(Disposition.TRANSIENT, error_class, **kwargs)


def _as_declared(exc: ClassifiedError) -> Failure:
    return Failure(
        exc.disposition,
        exc.error_class,
        retry_after=exc.retry_after,
        service_failure=exc.service_failure,
    )


# The table: (exception type, verdict). First match wins.
CLASSIFICATION: tuple = (
    # Every domain error a retry machine can meet says its own verdict by deriving from a
    # classified base in eventdrop/errors.py (the render errors: outbox/errors.py; a
    # handler's PermanentHandlerError: ingress/handlers.py), so this kernel names no app.
    (ClassifiedError, _as_declared),
    # Our own database: a deadlock, a serialization failure, a statement or lock timeout,
    # a restart. Retried like any transient error; never the row's death sentence.
    (OperationalError, lambda exc: _transient("database:OperationalError")),
    (InterfaceError, lambda exc: _transient("database:InterfaceError")),
)


def classify(exc: BaseException) -> Failure:
    """Sort one failure (see the module docstring); the only place this is decided."""
    for kind, verdict in CLASSIFICATION:
        if isinstance(exc, kind):
            return verdict(exc)
    return _transient(f"unclassified:{type(exc).__name__}"[:64])


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter.

    For the n-th failed attempt (n >= 1):

        ceiling(n) = min(cap_seconds, base_seconds * 2 ** (n - 1))
        delay(n)   = uniform(0, ceiling(n)),  or max(that, retry_after) when the callee
                                               asked for a pause (Retry-After), itself
                                               capped at cap_seconds

    and after `max_attempts` attempts the caller gives up (the row goes `dead`).
    Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter") spreads a herd of
    retries over the whole window instead of synchronising them at the ceiling.
    """

    max_attempts: int
    base_seconds: float
    cap_seconds: float

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.base_seconds <= 0 or self.cap_seconds < self.base_seconds:
            raise ValueError(f"invalid retry policy: {self}")

    def gives_up_after(self, attempts: int) -> bool:
        return attempts >= self.max_attempts

    def ceiling(self, attempt: int) -> float:
        return min(self.cap_seconds, self.base_seconds * 2 ** max(attempt - 1, 0))

    def delay(
        self, attempt: int, *, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        # Jitter is not a security boundary; the stdlib PRNG is the right tool.
        jittered = (rng or random).uniform(0, self.ceiling(attempt))
        if retry_after is not None and retry_after > 0:
            jittered = max(jittered, min(retry_after, self.cap_seconds))
        return jittered

    def worst_case_total_wait(self) -> float:
        """Sum of the longest possible pauses between the attempts (budget arithmetic)."""
        return sum(self.ceiling(n) for n in range(1, self.max_attempts))


class Action(StrEnum):
    RETRY = "retry"  # charged: back to pending at `retry_at`
    RELEASE = "release"  # not charged: back to pending at `retry_at`, attempt refunded
    GIVE_UP = "give_up"  # dead


@dataclass(frozen=True)
class RetryDecision:
    action: Action
    failure: Failure
    # When the next attempt is due (None when giving up).
    retry_at: datetime | None
    # Why, in words, for logs, history and a dead row's reason.
    reason: str

    @property
    def charged(self) -> bool:
        return self.action != Action.RELEASE


@dataclass(frozen=True)
class RetryStrategy:
    """What to do with one failed attempt of a row.

    - deferred failures, and failures the caller knows were not the row's (`charged=False`,
      e.g. the render service was failing as a whole): RELEASE, uncharged, due at
      `release_at` or after `policy.base_seconds`;
    - permanent failures: GIVE_UP;
    - transient failures, charged: RETRY after `policy.delay(attempts)`, and GIVE_UP only
      once the row has had `max_attempts` charged attempts AND its first charged failure
      lies `horizon_seconds` back. The pause before the last attempt is stretched to reach
      the horizon, so normally the row dies on exactly its max_attempts-th attempt, and a
      transient failure keeps it alive for at least the horizon:

          first charged failure at t0  ->  last attempt no earlier than t0 + horizon

    horizon_seconds = 0 is plain "dead after max_attempts".
    """

    policy: RetryPolicy
    horizon_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.horizon_seconds < 0:
            raise ValueError(f"invalid retry horizon: {self.horizon_seconds}")

    def decide(
        self,
        failure: Failure,
        *,
        attempts: int,
        now: datetime,
        first_failed_at: datetime | None = None,
        charged: bool = True,
        release_at: datetime | None = None,
        rng: random.Random | None = None,
    ) -> RetryDecision:
        """`attempts`: charged attempts so far, this one included; `first_failed_at`: the
        row's first charged failure (None if this is it)."""
        if failure.disposition == Disposition.DEFERRED:
            charged = False
        if not charged and failure.disposition != Disposition.PERMANENT:
            at = max(release_at or now + timedelta(seconds=self.policy.base_seconds), now)
            return RetryDecision(
                Action.RELEASE, failure, at, f"released uncharged: {failure.error_class}"
            )
        if failure.disposition == Disposition.PERMANENT:
            return RetryDecision(
                Action.GIVE_UP, failure, None, f"permanent error: {failure.error_class}"
            )
        horizon_end = (first_failed_at or now) + timedelta(seconds=self.horizon_seconds)
        if self.policy.gives_up_after(attempts) and now >= horizon_end:
            return RetryDecision(
                Action.GIVE_UP,
                failure,
                None,
                f"gave up after {attempts} attempt(s): {failure.error_class}",
            )
        at = now + timedelta(
            seconds=self.policy.delay(attempts, retry_after=failure.retry_after, rng=rng)
        )
        if attempts + 1 >= self.policy.max_attempts:
            # The next attempt may be the last: not before the horizon.
            at = max(at, horizon_end)
        return RetryDecision(
            Action.RETRY, failure, at, f"attempt {attempts} failed: {failure.error_class}"
        )


def fenced(
    queryset: QuerySet[_Row],
    *,
    claimed_at: datetime,
    attempts: int,
    processing: str = "processing",
) -> QuerySet[_Row]:
    """The row, only if it is still the claim this worker made (status, claimed_at,
    attempts): an outcome recorded through this cannot overwrite a newer claim."""
    return queryset.filter(status=processing, claimed_at=claimed_at, attempts=attempts)
