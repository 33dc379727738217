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


# --- RetryStrategy.decide: retry, when, or give up, and why (deliveries and outbox alike) ---

from datetime import UTC, datetime, timedelta  # noqa: E402

from eventdrop.retry import Action, Disposition, Failure, RetryPolicy, RetryStrategy  # noqa: E402

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(hours=24)
SERVICE = Failure(Disposition.TRANSIENT, "http_500", service_failure=True)
DATABASE = Failure(Disposition.TRANSIENT, "database:OperationalError")
PERMANENT = Failure(Disposition.PERMANENT, "http_422")
CONFIG = Failure(Disposition.DEFERRED, "not_configured")
STRATEGY = RetryStrategy(
    policy=RetryPolicy(max_attempts=5, base_seconds=60, cap_seconds=1800), horizon_seconds=86400
)


@pytest.mark.parametrize(
    ("failure", "attempts", "first_failed", "charged", "action", "earliest"),
    [
        # charged transient failures: backoff, the 4th failure's pause reaches the horizon
        (SERVICE, 1, None, True, Action.RETRY, NOW),
        (SERVICE, 3, NOW - HOUR, True, Action.RETRY, NOW),
        (SERVICE, 4, NOW - HOUR, True, Action.RETRY, NOW - HOUR + DAY),
        # the 5th charged attempt, past the horizon: dead
        (SERVICE, 5, NOW - DAY, True, Action.GIVE_UP, None),
        # the 5th charged attempt before the horizon (a stale re-arm ran it early): not yet
        (SERVICE, 5, NOW - HOUR, True, Action.RETRY, NOW - HOUR + DAY),
        (DATABASE, 1, None, True, Action.RETRY, NOW),
        (DATABASE, 5, NOW - DAY, True, Action.GIVE_UP, None),
        # permanent: dead at once, whatever the count
        (PERMANENT, 1, None, True, Action.GIVE_UP, None),
        # not the row's: released, never charged, never dead — even on "the last attempt"
        (SERVICE, 5, NOW - 2 * DAY, False, Action.RELEASE, NOW),
        (CONFIG, 5, NOW - 2 * DAY, True, Action.RELEASE, NOW + timedelta(seconds=60)),
    ],
)
def test_decide(failure, attempts, first_failed, charged, action, earliest):
    decision = STRATEGY.decide(
        failure,
        attempts=attempts,
        now=NOW,
        first_failed_at=first_failed,
        charged=charged,
        rng=FixedRandom(0.0),
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
    decision = STRATEGY.decide(SERVICE, attempts=2, now=NOW, charged=False, release_at=until)
    assert (decision.action, decision.retry_at) == (Action.RELEASE, until)


def test_horizon_zero_is_plain_dead_after_max_attempts():
    strategy = RetryStrategy(policy=STRATEGY.policy)
    assert strategy.decide(SERVICE, attempts=5, now=NOW).action == Action.GIVE_UP
    assert strategy.decide(SERVICE, attempts=4, now=NOW).action == Action.RETRY


def test_the_outbox_strategy_follows_settings(settings):
    from outbox.services import outbox_retry_strategy

    settings.OUTBOX_TRANSIENT_HORIZON_SECONDS = 7200
    assert outbox_retry_strategy().horizon_seconds == 7200
    assert outbox_retry_strategy().policy == outbox_retry_policy()
