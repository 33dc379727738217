"""The outbox's retry policy (eventdrop.retry.RetryPolicy with the outbox settings), as a table.

ceiling(n) = min(cap, base * 2 ** (n - 1)); delay(n) = uniform(0, ceiling(n)),
at least min(Retry-After, cap); give up (dead) after max_attempts attempts.
"""

import random

import pytest

from outbox.services import outbox_retry_policy


class FixedRandom(random.Random):
    """uniform(a, b) returns the point `fraction` of the way from a to b."""

    def __init__(self, fraction: float):
        super().__init__()
        self.fraction = fraction

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.fraction


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(1, 60.0), (2, 120.0), (3, 240.0), (4, 480.0), (5, 960.0), (6, 1800.0), (12, 1800.0)],
)
def test_ceiling_doubles_from_the_base_up_to_the_cap(attempt, ceiling):
    assert outbox_retry_policy().ceiling(attempt) == ceiling


@pytest.mark.parametrize(
    ("attempt", "fraction", "retry_after", "delay"),
    [
        (1, 0.0, None, 0.0),  # full jitter reaches down to zero…
        (1, 1.0, None, 60.0),  # …and up to the ceiling, never above it
        (3, 0.5, None, 120.0),
        (1, 0.0, 300.0, 300.0),  # Retry-After wins over a shorter jittered pause
        (4, 1.0, 300.0, 480.0),  # but never shortens a longer one
        (1, 0.0, 86400.0, 1800.0),  # and is itself capped
        (1, 0.0, 0.0, 0.0),
    ],
)
def test_delay_is_full_jitter_honouring_retry_after(attempt, fraction, retry_after, delay):
    policy = outbox_retry_policy()
    assert policy.delay(attempt, retry_after=retry_after, rng=FixedRandom(fraction)) == delay


@pytest.mark.parametrize(
    ("attempts", "gives_up"), [(1, False), (2, False), (4, False), (5, True), (6, True)]
)
def test_gives_up_after_five_attempts(attempts, gives_up):
    assert outbox_retry_policy().gives_up_after(attempts) is gives_up


def test_the_policy_follows_settings(settings):
    settings.OUTBOX_MAX_ATTEMPTS = 2
    settings.OUTBOX_BACKOFF_BASE_SECONDS = 1.0
    settings.OUTBOX_BACKOFF_CAP_SECONDS = 3.0
    policy = outbox_retry_policy()
    assert [policy.ceiling(n) for n in (1, 2, 3)] == [1.0, 2.0, 3.0]
    assert policy.gives_up_after(2)
