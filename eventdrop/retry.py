"""Retry policy shared by every retry loop in the project (deliveries, outbox).

A small value object in the spirit of procrastinate's RetryStrategy: the rows carry
attempts / next_attempt_at, this only answers "give up?" and "how long until the next try?".
"""

import random
from dataclasses import dataclass


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
