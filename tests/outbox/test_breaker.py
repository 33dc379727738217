"""The circuit breaker: closed → open → half-open → closed, state shared in the database."""

import threading
from datetime import timedelta

import pytest
from django.db import connection

from outbox.breaker import (
    RENDER_SERVICE_BREAKER as NAME,
)
from outbox.breaker import (
    BreakerConfig,
    circuit_breaker_acquire,
    circuit_breaker_record_failure,
    circuit_breaker_record_success,
)
from outbox.dispatcher import dispatch_run
from outbox.models import AttemptOutcome, CircuitBreaker, RecapSideEffect
from tests.recaps.fixtures import T0

pytestmark = pytest.mark.django_db

CONFIG = BreakerConfig(
    failure_threshold=3, cooldown=timedelta(seconds=60), probe_timeout=timedelta(seconds=13)
)


def fail(times=1, at=T0):
    for _ in range(times):
        state = circuit_breaker_record_failure(
            name=NAME, error_class="connection_error", now=at, config=CONFIG
        )
    return state


def acquire(at):
    return circuit_breaker_acquire(name=NAME, now=at, config=CONFIG)


def test_opens_after_n_consecutive_failures_and_skips_until_the_cooldown_is_over():
    assert fail(2) == "closed"
    assert acquire(T0).allowed
    assert fail() == "open"
    permit = acquire(T0 + timedelta(seconds=59))
    assert not permit.allowed and permit.retry_at == T0 + timedelta(seconds=60)


def test_a_success_resets_the_count():
    fail(2)
    circuit_breaker_record_success(name=NAME)
    assert fail(2) == "closed"
    assert CircuitBreaker.objects.get(name=NAME).consecutive_failures == 2


def test_half_open_lets_exactly_one_probe_through_and_its_success_closes():
    fail(3)
    after = T0 + timedelta(seconds=60)
    probe = acquire(after)
    assert probe.allowed and probe.probe
    assert not acquire(after).allowed  # a second caller waits for the probe
    circuit_breaker_record_success(name=NAME)
    breaker = CircuitBreaker.objects.get(name=NAME)
    assert (breaker.state, breaker.consecutive_failures) == ("closed", 0)
    assert acquire(after).allowed


def test_a_failed_probe_opens_it_again_for_another_cooldown():
    fail(3)
    probe_at = T0 + timedelta(seconds=61)
    assert acquire(probe_at).probe
    assert fail(at=probe_at) == "open"
    assert not acquire(probe_at + timedelta(seconds=59)).allowed
    assert acquire(probe_at + timedelta(seconds=60)).probe


def test_a_probe_whose_worker_died_is_replaced_after_the_probe_timeout():
    fail(3)
    probe_at = T0 + timedelta(seconds=60)
    assert acquire(probe_at).probe
    assert not acquire(probe_at + timedelta(seconds=12)).allowed
    assert acquire(probe_at + timedelta(seconds=13)).probe


def test_an_open_breaker_stops_the_dispatcher_without_spending_attempts(
    fake_renderer, paid_recap, settings
):
    settings.RENDER_BREAKER_FAILURE_THRESHOLD = 3
    fake_renderer.configure(mode="down")
    rows = [paid_recap()[1] for _ in range(8)]
    report = dispatch_run(now=T0)
    # Three calls fail, the breaker opens, and the other five rows are not even claimed.
    assert report.claimed == 3 and report.breaker == "open"
    assert RecapSideEffect.objects.filter(attempts=1).count() == 3
    assert RecapSideEffect.objects.filter(attempts=0, status="pending").count() == 5
    # While open, a later run makes no call at all.
    health_checks = fake_renderer.health_checks
    report = dispatch_run(now=T0 + timedelta(seconds=30))
    assert report.claimed == 0 and fake_renderer.health_checks == health_checks
    # After the cool-down, one probe; it succeeds and the breaker closes for the rest.
    fake_renderer.configure(mode="ok")
    report = dispatch_run(now=T0 + timedelta(hours=1))
    assert report.count(AttemptOutcome.DONE) == 8 and report.breaker == "closed"
    assert {row.idempotency_key for row in rows} == set(fake_renderer.renders)


def test_a_dispatch_denied_by_the_breaker_is_released_with_its_attempt_refunded(
    fake_renderer, paid_recap
):
    from outbox.dispatcher import dispatch_one
    from outbox.services import side_effects_claim

    _, side_effect = paid_recap()
    (claim,) = side_effects_claim(limit=1, now=T0)
    fail(3)  # another process opened the breaker after our claim
    outcome = dispatch_one(claim, deadline=1e12, now=lambda: T0, breaker_config=CONFIG)
    side_effect.refresh_from_db()
    assert outcome == AttemptOutcome.SKIPPED
    assert side_effect.status == "pending" and side_effect.attempts == 0
    assert side_effect.next_attempt_at == T0 + timedelta(seconds=60)
    assert fake_renderer.posts_by_key == {}
    assert list(side_effect.history.values_list("outcome", flat=True)) == ["skipped"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_shared_state_many_processes_one_probe():
    fail(3)
    after = T0 + timedelta(seconds=60)
    permits = []
    barrier = threading.Barrier(8)

    def worker():
        try:
            barrier.wait(timeout=10)
            permits.append(acquire(after))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(permits) == 8
    assert sum(p.allowed for p in permits) == 1
    assert CircuitBreaker.objects.get(name=NAME).state == "half_open"
