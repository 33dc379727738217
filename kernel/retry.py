"""The one retry decision of the project: deliveries (ingress/deliveries/) and side effects
(outbox/) both ask it "retry, when, or give up — and why".

The finality rule (docs/outbox.md, "The finality rule"), which everything here serves:

    A row becomes terminal only on
      (a) an explicit verdict about *this* request — a signed `render.failed` for the
          current render, a 422 for this request, a handler's permanent domain error
          (Disposition.PERMANENT); or
      (b) N charged attempts AND the transient horizon, where only failures that can be
          about the row are charged (Disposition.TRANSIENT).
    Answers about the service, its deploy or our own database — 3xx, 401, 403, 404, 405,
    408, 409, 410, 425, 429, 5xx, timeouts, resets, any database error (statement and lock
    timeouts, serialization failures, deadlocks, a restart, …) — never charge a row
    (Disposition.DEFERRED). The service's answers count toward its breaker; ours toward
    nothing. An answer that is neither a success nor a verdict (`ambiguous`) also leaves
    the row waiting, and an alert fires: it does not die.

Three pieces, in the spirit of procrastinate's RetryStrategy / RetryDecision:

- `classify(exc) -> Failure`: the ONE classification table (`CLASSIFICATION`, first match
  wins). A domain error declares its own verdict by its base class (the error contract in
  kernel/errors.py: PermanentError, DeferredError, ServiceFailure); the table reads that,
  so this kernel module imports no app. Our own database's errors, whatever their class,
  are deferred. Anything the table does not name is transient, and charged: a new error
  source is retried a bounded number of times and then ends `dead`, visibly, with its
  class name ("unclassified:KeyError") — never silently final on its first occurrence.
- `RetryPolicy`: the backoff formula.
- `RetryStrategy.decide(...) -> RetryDecision`: what to do with one failed attempt.

Callers record the decision on their row, fenced on (claimed_at, attempts) with `fenced`,
so a worker whose row was re-armed and claimed again meanwhile cannot overwrite the new run
— its success included.
"""

import email.utils
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TypeVar

import psycopg
from django.db import Error as DjangoDatabaseError
from django.db.models import Model, QuerySet

from kernel.errors import ClassifiedError, Disposition

_Row = TypeVar("_Row", bound=Model)


@dataclass(frozen=True)
class Failure:
    """One failure, classified."""

    disposition: Disposition
    # Short machine-readable class, stored on the row (last_error_class) and in history.
    error_class: str
    # Seconds the callee asked us to wait (Retry-After), if it did.
    retry_after: float | None = None
    # The remote service (or its deploy) answered about itself, not about this row (5xx,
    # 429, 3xx, 404 …, timeouts, refused connections): the circuit breaker's input.
    service_failure: bool = False
    # Neither a success nor a verdict about the row: it waits, and an alert fires.
    ambiguous: bool = False

    @property
    def charged(self) -> bool:
        """Can it be about the row? Only then does it count toward the row's attempts."""
        return self.disposition != Disposition.DEFERRED

    @property
    def database(self) -> bool:
        return self.error_class.startswith(DATABASE_PREFIX)


DATABASE_PREFIX = "database:"


def _as_declared(exc: ClassifiedError) -> Failure:
    return Failure(
        exc.disposition,
        exc.error_class,
        retry_after=exc.retry_after,
        service_failure=exc.service_failure,
        ambiguous=exc.ambiguous,
    )


def _database(exc: BaseException) -> Failure:
    """Our own database, whatever it said: about us, never about the row. Named by the
    driver's class when Django wrapped one (`database:LockNotAvailable`,
    `database:QueryCanceled`, `database:SerializationFailure`, `database:DeadlockDetected`)."""
    cause = exc.__cause__ if isinstance(exc.__cause__, psycopg.Error) else exc
    return Failure(Disposition.DEFERRED, f"{DATABASE_PREFIX}{type(cause).__name__}"[:64])


# The table: (exception type, verdict). First match wins.
CLASSIFICATION: tuple = (
    # Every domain error a retry machine can meet says its own verdict by deriving from a
    # classified base in kernel/errors.py (the render errors: outbox/errors.py; a
    # handler's PermanentHandlerError: ingress/handlers.py), so this kernel names no app.
    (ClassifiedError, _as_declared),
    # Our own database, in every class Django knows (DatabaseError and its DataError,
    # IntegrityError, InternalError, OperationalError, ProgrammingError,
    # NotSupportedError; InterfaceError) and the driver's own, unwrapped: a statement or
    # lock timeout, a serialization failure, a deadlock, a restart, a schema a deploy has
    # not migrated yet. Never the row's death sentence, never charged.
    (DjangoDatabaseError, _database),
    (psycopg.Error, _database),
)


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP-date (RFC 9110 10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(tz=UTC))).total_seconds(), 0.0)


def classify(exc: BaseException) -> Failure:
    """Sort one failure (see the module docstring); the only place this is decided."""
    for kind, verdict in CLASSIFICATION:
        if isinstance(exc, kind):
            return verdict(exc)
    return Failure(Disposition.TRANSIENT, f"unclassified:{type(exc).__name__}"[:64])


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with full jitter.

    For the n-th failed attempt (n >= 1):

        ceiling(n) = min(cap_seconds, base_seconds * 2 ** (n - 1))
        delay(n)   = uniform(0, ceiling(n)),  or max(that, retry_after) when the callee
                                               asked for a pause (Retry-After), itself
                                               capped at cap_seconds

    and after `max_attempts` attempts the caller gives up (the row goes `dead`).
    `jitter=False` waits the ceiling itself: one row's own retry, not a herd to spread.
    Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter") spreads a herd of
    retries over the whole window instead of synchronising them at the ceiling.

    A row waiting on someone else (never charged, so `n` does not grow) backs off by how
    long it has waited already: `release_delay(waited)` = uniform(0, min(cap, max(base,
    waited))) — each pause at most as long as the wait so far, which doubles the wait like
    the charged backoff does, without a counter.
    """

    max_attempts: int
    base_seconds: float
    cap_seconds: float
    jitter: bool = True

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
        return self._jittered(self.ceiling(attempt), retry_after, rng)

    def release_delay(
        self,
        waited_seconds: float,
        *,
        retry_after: float | None = None,
        rng: random.Random | None = None,
    ) -> float:
        ceiling = min(self.cap_seconds, max(self.base_seconds, waited_seconds))
        return self._jittered(ceiling, retry_after, rng)

    def _jittered(
        self, ceiling: float, retry_after: float | None, rng: random.Random | None
    ) -> float:
        # Jitter is not a security boundary; the stdlib PRNG is the right tool.
        jittered = (rng or random).uniform(0, ceiling) if self.jitter else ceiling
        if retry_after is not None and retry_after > 0:
            jittered = max(jittered, min(retry_after, self.cap_seconds))
        return jittered

    def worst_case_total_wait(self) -> float:
        """Sum of the longest possible pauses between the attempts (budget arithmetic)."""
        return sum(self.ceiling(n) for n in range(1, self.max_attempts))


class Action(StrEnum):
    RETRY = "retry"  # charged: back to pending at `retry_at`
    RELEASE = "release"  # not charged: back to pending at `retry_at`, attempt given back
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
    """What to do with one failed attempt of a row (the finality rule, module docstring).

    - deferred failures (not about the row): RELEASE, uncharged, due at `release_at` (the
      breaker's cool-down, say) or after `policy.release_delay(time waited so far)`;
    - permanent failures (a verdict about the row): GIVE_UP;
    - transient failures (may be about the row), charged: RETRY after
      `policy.delay(attempts)`, and GIVE_UP only once the row has had `max_attempts`
      charged attempts AND its first charged failure lies `horizon_seconds` back. The pause
      before the last attempt is stretched to reach the horizon, so normally the row dies on
      exactly its max_attempts-th attempt, and a transient failure keeps it alive for at
      least the horizon:

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
        waiting_since: datetime | None = None,
        release_at: datetime | None = None,
        rng: random.Random | None = None,
    ) -> RetryDecision:
        """`attempts`: charged attempts so far, this one included; `first_failed_at`: the
        row's first charged failure (None if this is it); `waiting_since`: since when the
        row has waited on others' failures (None if this is the first)."""
        if failure.disposition == Disposition.DEFERRED:
            if release_at is None:
                waited = (now - (waiting_since or now)).total_seconds()
                pause = self.policy.release_delay(waited, retry_after=failure.retry_after, rng=rng)
                release_at = now + timedelta(seconds=pause)
            elif failure.retry_after:
                # The callee asked for a pause: not before it, whatever the breaker says.
                asked = min(failure.retry_after, self.policy.cap_seconds)
                release_at = max(release_at, now + timedelta(seconds=asked))
            return RetryDecision(
                Action.RELEASE,
                failure,
                max(release_at, now),
                f"released uncharged: {failure.error_class}",
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
    attempts): an outcome recorded through this — a success as much as a failure — cannot
    overwrite a newer claim."""
    return queryset.filter(status=processing, claimed_at=claimed_at, attempts=attempts)
