"""The outbox's retry policy (kernel.retry.RetryPolicy with the outbox settings), as a table.

ceiling(n) = min(cap, base * 2 ** (n - 1)); delay(n) = uniform(0, ceiling(n)),
at least min(Retry-After, cap); give up (dead) after max_attempts attempts.
"""

import random

import pytest

from kernel.retry import RetryPolicy
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


def test_without_jitter_a_pause_is_its_ceiling():
    """One row's own retry (the inbox's settle failures): the ceiling itself, charged or
    released, and Retry-After still wins over a shorter pause."""
    policy = RetryPolicy(max_attempts=5, base_seconds=30, cap_seconds=3600, jitter=False)
    assert [policy.delay(n, rng=FixedRandom(0.0)) for n in (1, 2, 3)] == [30.0, 60.0, 120.0]
    assert policy.release_delay(600.0, rng=FixedRandom(0.0)) == 600.0
    assert policy.delay(1, retry_after=90.0) == 90.0


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


# --- RetryStrategy.decide: retry, when, or give up, and why (deliveries and outbox alike) ---

from datetime import UTC, datetime, timedelta  # noqa: E402

from kernel.retry import Action, Disposition, Failure, RetryStrategy  # noqa: E402

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(hours=24)
OWN = Failure(Disposition.TRANSIENT, "unclassified:KeyError")
SERVICE = Failure(Disposition.DEFERRED, "http_500", service_failure=True)
DATABASE = Failure(Disposition.DEFERRED, "database:LockNotAvailable")
PERMANENT = Failure(Disposition.PERMANENT, "http_422")
CONFIG = Failure(Disposition.DEFERRED, "not_configured")
STRATEGY = RetryStrategy(
    policy=RetryPolicy(max_attempts=5, base_seconds=60, cap_seconds=1800), horizon_seconds=86400
)


@pytest.mark.parametrize(
    ("failure", "attempts", "first_failed", "action", "earliest"),
    [
        # failures that may be about the row, charged: backoff, the 4th failure's pause
        # reaches the horizon
        (OWN, 1, None, Action.RETRY, NOW),
        (OWN, 3, NOW - HOUR, Action.RETRY, NOW),
        (OWN, 4, NOW - HOUR, Action.RETRY, NOW - HOUR + DAY),
        # the 5th charged attempt, past the horizon: dead
        (OWN, 5, NOW - DAY, Action.GIVE_UP, None),
        # the 5th charged attempt before the horizon (a stale re-arm ran it early): not yet
        (OWN, 5, NOW - HOUR, Action.RETRY, NOW - HOUR + DAY),
        # a verdict: dead at once, whatever the count
        (PERMANENT, 1, None, Action.GIVE_UP, None),
        # not about the row — the service, our database, our configuration: released, never
        # charged, never dead, even on "the last attempt" long past the horizon
        (SERVICE, 5, NOW - 2 * DAY, Action.RELEASE, NOW),
        (DATABASE, 5, NOW - 2 * DAY, Action.RELEASE, NOW),
        (CONFIG, 5, NOW - 2 * DAY, Action.RELEASE, NOW),
    ],
)
def test_decide(failure, attempts, first_failed, action, earliest):
    decision = STRATEGY.decide(
        failure, attempts=attempts, now=NOW, first_failed_at=first_failed, rng=FixedRandom(0.0)
    )
    assert decision.action == action
    assert decision.charged is (action != Action.RELEASE)
    if earliest is None:
        assert decision.retry_at is None
    else:
        assert decision.retry_at >= earliest
    assert failure.error_class in decision.reason


def test_a_release_waits_for_the_breaker():
    until = NOW + timedelta(minutes=5)
    decision = STRATEGY.decide(SERVICE, attempts=2, now=NOW, release_at=until)
    assert (decision.action, decision.retry_at) == (Action.RELEASE, until)


@pytest.mark.parametrize(
    ("waited", "ceiling"),
    [(0, 60.0), (30, 60.0), (60, 60.0), (300, 300.0), (1000, 1000.0), (86400, 1800.0)],
)
def test_an_uncharged_wait_backs_off_by_how_long_the_row_has_waited(waited, ceiling):
    # Never charged, so the attempt count cannot drive the backoff: the wait so far does.
    decision = STRATEGY.decide(
        DATABASE,
        attempts=1,
        now=NOW,
        waiting_since=NOW - timedelta(seconds=waited),
        rng=FixedRandom(1.0),
    )
    assert decision.retry_at == NOW + timedelta(seconds=ceiling)


def test_horizon_zero_is_plain_dead_after_max_attempts():
    strategy = RetryStrategy(policy=STRATEGY.policy)
    assert strategy.decide(OWN, attempts=5, now=NOW).action == Action.GIVE_UP
    assert strategy.decide(OWN, attempts=4, now=NOW).action == Action.RETRY


def test_the_outbox_strategy_follows_settings(settings):
    from outbox.services import outbox_retry_strategy

    settings.OUTBOX_TRANSIENT_HORIZON_SECONDS = 7200
    assert outbox_retry_strategy().horizon_seconds == 7200
    assert outbox_retry_strategy().policy == outbox_retry_policy()
