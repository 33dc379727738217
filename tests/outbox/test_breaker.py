"""The circuit breaker: judged by real calls, shared in the database, off the per-row path.

Each `Breaker` is one dispatcher run's view; two views are two processes.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection

from outbox.breaker import RENDER_SERVICE_BREAKER as NAME
from outbox.breaker import Breaker, BreakerConfig
from outbox.dispatcher import dispatch_run
from outbox.models import AttemptOutcome, CircuitBreaker, RecapSideEffect
from tests.recaps.fixtures import T0

pytestmark = pytest.mark.django_db

# refresh 0: every view reads the shared row (deterministic; production reads every 500 ms)
CONFIG = BreakerConfig(
    failure_threshold=3,
    cooldown=timedelta(seconds=60),
    probe_timeout=timedelta(seconds=13),
    refresh_seconds=0,
)


def view():
    return Breaker(name=NAME, config=CONFIG)


def fail(breaker, row, at=T0, probe=False, attempts=1):
    return breaker.record_failure(
        side_effect_id=row, attempts=attempts, error_class="http_500", probe=probe, now=at
    )


def state():
    return CircuitBreaker.objects.get(name=NAME).state


def test_a_streak_of_distinct_rows_opens_it_and_the_tripping_failure_is_not_charged():
    breaker = view()
    assert fail(breaker, 1).charged and fail(breaker, 2).charged
    judgement = fail(breaker, 3)
    assert (judgement.charged, judgement.state) == (False, "open")
    assert judgement.retry_at == T0 + timedelta(seconds=60)
    # The streak's earlier failures were the service's: the dispatcher refunds them.
    assert judgement.refund == ((1, 1, 1), (2, 1, 1), (3, 1, 1))
    admission = breaker.admit(now=T0 + timedelta(seconds=59))
    assert not admission.allowed and admission.retry_at == T0 + timedelta(seconds=60)
    # A call let through before it opened, failing now: not charged either.
    assert not fail(breaker, 4, at=T0 + timedelta(seconds=1)).charged


def test_one_row_failing_again_and_again_never_opens_it():
    breaker = view()
    for _ in range(10):
        assert fail(breaker, 7).charged
    assert state() == "closed"


def test_a_real_answer_ends_the_streak():
    breaker = view()
    fail(breaker, 1)
    fail(breaker, 2)
    breaker.record_success(probe=False, now=T0)
    assert fail(breaker, 3).charged and fail(breaker, 4).charged
    assert state() == "closed"
    assert CircuitBreaker.objects.get(name=NAME).failing_rows == [[3, 1, 1], [4, 1, 1]]


def test_half_open_lets_exactly_one_real_dispatch_through_and_its_success_closes():
    for row in (1, 2, 3):
        fail(view(), row)
    after = T0 + timedelta(seconds=60)
    first, second = view(), view()
    assert first.claim_limit(4, now=after) == 1  # one row: the probe
    probe = first.admit(now=after)
    assert probe.allowed and probe.probe
    assert first.claim_limit(4, now=after) == 0  # its own probe is in flight
    assert not second.admit(now=after).allowed  # another process waits for it
    assert second.claim_limit(4, now=after) == 0
    first.record_success(probe=True, now=after)
    breaker = CircuitBreaker.objects.get(name=NAME)
    assert (breaker.state, breaker.consecutive_failures, breaker.failing_rows) == ("closed", 0, [])
    assert second.admit(now=after).allowed and second.claim_limit(4, now=after) == 4


def test_a_failed_probe_is_not_charged_and_opens_it_for_another_cooldown():
    for row in (1, 2, 3):
        fail(view(), row)
    probe_at = T0 + timedelta(seconds=61)
    breaker = view()
    assert breaker.admit(now=probe_at).probe
    judgement = fail(breaker, 9, at=probe_at, probe=True)
    assert (judgement.charged, judgement.state) == (False, "open")
    assert not breaker.admit(now=probe_at + timedelta(seconds=59)).allowed
    assert breaker.admit(now=probe_at + timedelta(seconds=60)).probe


def test_a_probe_whose_worker_died_is_replaced_after_the_probe_timeout():
    for row in (1, 2, 3):
        fail(view(), row)
    probe_at = T0 + timedelta(seconds=60)
    assert view().admit(now=probe_at).probe
    assert not view().admit(now=probe_at + timedelta(seconds=12)).allowed
    assert view().admit(now=probe_at + timedelta(seconds=13)).probe


def test_a_closed_clean_breaker_costs_a_dispatch_no_query(django_assert_num_queries):
    breaker = Breaker(name=NAME, config=BreakerConfig(**{**CONFIG.__dict__, "refresh_seconds": 60}))
    breaker.view()  # the run's first read
    with django_assert_num_queries(0):
        for _ in range(100):
            assert breaker.admit(now=T0).allowed
            breaker.record_success(probe=False, now=T0)
            assert breaker.claim_limit(4, now=T0) == 4


def test_health_is_prechecked_only_on_the_half_open_probe(fake_renderer, paid_recap, settings):
    # Closed: the render request is the evidence; a health call per row halved throughput.
    settings.RENDER_BREAKER_FAILURE_THRESHOLD = 3
    for _ in range(3):
        paid_recap()
    report = dispatch_run(now=T0)
    assert report.count(AttemptOutcome.DONE) == 3 and fake_renderer.health_checks == 0
    # An outage opens it; after the cool-down the probe asks /health first. A service that
    # says it is unhealthy gets no render: the probe fails there and it stays open.
    fake_renderer.configure(mode="down")
    for _ in range(4):
        paid_recap()
    assert dispatch_run(now=T0).breaker == "open"
    fake_renderer.configure(mode="unhealthy")
    posts = sum(fake_renderer.stats()["posts_by_key"].values())
    report = dispatch_run(now=T0 + timedelta(hours=1))
    assert report.breaker == "open" and fake_renderer.health_checks == 1
    assert sum(fake_renderer.stats()["posts_by_key"].values()) == posts
    # Healthy again: the next probe checks health once more, renders, and the rest go
    # without a precheck.
    fake_renderer.configure(mode="ok")
    report = dispatch_run(now=T0 + timedelta(hours=2))
    assert report.count(AttemptOutcome.DONE) == 4 and report.breaker == "closed"
    assert fake_renderer.health_checks == 2


def test_an_open_breaker_stops_the_dispatcher_without_spending_attempts(
    fake_renderer, paid_recap, settings
):
    settings.RENDER_BREAKER_FAILURE_THRESHOLD = 3
    fake_renderer.configure(mode="down")
    rows = [paid_recap()[1] for _ in range(8)]
    report = dispatch_run(now=T0)
    # Three calls fail and the breaker opens; the row claimed ahead is released without a
    # call, the other four are not even claimed. The three are refunded: the service
    # failed, not they.
    assert report.claimed == 4 and report.breaker == "open"
    assert report.count(AttemptOutcome.SKIPPED) == 1
    assert sum(fake_renderer.stats()["posts_by_key"].values()) == 0  # down: nothing arrived
    assert set(RecapSideEffect.objects.values_list("attempts", flat=True)) == {0}
    assert RecapSideEffect.objects.filter(wait_reason="breaker").count() == 4
    # While open, a later run makes no call at all.
    health_checks = fake_renderer.health_checks
    report = dispatch_run(now=T0 + timedelta(seconds=30))
    assert report.claimed == 0 and fake_renderer.health_checks == health_checks
    assert sum(fake_renderer.stats()["posts_by_key"].values()) == 0
    # After the cool-down, one real dispatch as the probe; it renders and the breaker
    # closes for the rest.
    fake_renderer.configure(mode="ok")
    report = dispatch_run(now=T0 + timedelta(hours=1))
    assert report.count(AttemptOutcome.DONE) == 8 and report.breaker == "closed"
    assert {row.idempotency_key for row in rows} == set(fake_renderer.renders)
    assert set(RecapSideEffect.objects.values_list("attempts", flat=True)) == {1}


def test_a_dispatch_denied_by_the_breaker_is_released_with_its_attempt_refunded(
    fake_renderer, paid_recap
):
    from outbox.dispatcher import dispatch_one
    from outbox.services import side_effects_claim

    _, side_effect = paid_recap()
    (claim,) = side_effects_claim(limit=1, now=T0)
    for row in (101, 102, 103):  # another process opened the breaker after our claim
        fail(view(), row)
    outcome = dispatch_one(claim, deadline=1e12, breaker=view(), now=lambda: T0)
    side_effect.refresh_from_db()
    assert outcome == AttemptOutcome.SKIPPED
    assert side_effect.status == "pending" and side_effect.attempts == 0
    assert side_effect.next_attempt_at == T0 + timedelta(seconds=60)
    assert side_effect.wait_reason == "breaker"
    assert fake_renderer.posts_by_key == {}
    assert list(side_effect.history.values_list("outcome", flat=True)) == ["skipped"]


@pytest.mark.django_db(transaction=True)
def test_shared_state_many_processes_one_probe():
    for row in (1, 2, 3):
        fail(view(), row)
    after = T0 + timedelta(seconds=60)
    admissions = []
    barrier = threading.Barrier(8)

    def worker():
        try:
            barrier.wait(timeout=10)
            admissions.append(view().admit(now=after))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(admissions) == 8
    assert sum(a.allowed for a in admissions) == 1
    assert state() == "half_open"


@pytest.mark.django_db(transaction=True)
def test_a_breaker_write_behind_a_held_row_lock_is_dropped_within_its_lock_timeout():
    import time

    import psycopg

    fail(view(), 1)
    settings_dict = connection.settings_dict
    dsn = (
        f"host={settings_dict['HOST'] or '127.0.0.1'} port={settings_dict['PORT'] or 5432} "
        f"user={settings_dict['USER']} dbname={settings_dict['NAME']}"
    )
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM outbox_circuit_breakers FOR UPDATE")
        started = time.monotonic()
        judgement = fail(view(), 2)  # judged on what it last saw; never raises
        assert judgement.charged and time.monotonic() - started < 3
        holder.rollback()
    assert CircuitBreaker.objects.get(name=NAME).failing_rows == [[1, 1, 1]]
