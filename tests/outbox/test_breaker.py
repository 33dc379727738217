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
from tests.support.sql import database_dsn

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


def fail(breaker, row, at=T0, probe=False):
    return breaker.record_failure(side_effect_id=row, error_class="http_500", probe=probe, now=at)


def proven(at=T0):
    """A view of a breaker whose service just rendered something (at `at`)."""
    breaker = view()
    breaker.record_success(probe=False, now=at)
    return breaker


def open_it(at=T0):
    breaker = proven(at)
    for row in (1, 2, 3):
        fail(breaker, row, at=at)
    assert state() == "open"


def state():
    return CircuitBreaker.objects.get(name=NAME).state


def test_a_proven_service_opens_on_a_streak_of_distinct_rows():
    breaker = proven()
    # Nothing is charged whatever the breaker says: it only says when to try again.
    assert fail(breaker, 1) is None and fail(breaker, 2) is None
    assert state() == "closed"
    assert fail(breaker, 3) == T0 + timedelta(seconds=60)
    assert state() == "open"
    admission = breaker.admit(now=T0 + timedelta(seconds=59))
    assert not admission.allowed and admission.retry_at == T0 + timedelta(seconds=60)
    # A call let through before it opened, failing now, waits for the cool-down too.
    assert fail(breaker, 4, at=T0 + timedelta(seconds=1)) == T0 + timedelta(seconds=60)


def test_an_unproven_service_opens_on_the_first_failure_at_any_traffic():
    # Nothing has rendered yet: one row failing is enough, so it is tried once per cool-down.
    assert fail(view(), 1) == T0 + timedelta(seconds=60)
    assert state() == "open"
    CircuitBreaker.objects.all().delete()
    # Proven once, but longer ago than a cool-down: unproven again.
    breaker = proven(T0 - timedelta(seconds=61))
    assert fail(breaker, 1) == T0 + timedelta(seconds=60)


def test_one_row_failing_again_and_again_never_opens_a_proven_breaker():
    for second in range(10):
        at = T0 + timedelta(seconds=second)
        breaker = proven(at)  # the service renders the others meanwhile
        assert fail(breaker, 7, at=at) is None
    assert state() == "closed"
    assert CircuitBreaker.objects.get(name=NAME).failing_rows == [7]


def test_only_a_render_accepted_ends_the_streak():
    breaker = proven()
    fail(breaker, 1)
    fail(breaker, 2)
    breaker.record_success(probe=False, now=T0)
    assert fail(breaker, 3) is None and fail(breaker, 4) is None
    assert state() == "closed"
    assert CircuitBreaker.objects.get(name=NAME).failing_rows == [3, 4]


def test_half_open_lets_exactly_one_real_dispatch_through_and_its_success_closes():
    open_it()
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


def test_a_failed_probe_opens_it_for_another_cooldown():
    open_it()
    probe_at = T0 + timedelta(seconds=61)
    breaker = view()
    assert breaker.admit(now=probe_at).probe
    assert fail(breaker, 9, at=probe_at, probe=True) == probe_at + timedelta(seconds=60)
    assert state() == "open"
    assert not breaker.admit(now=probe_at + timedelta(seconds=59)).allowed
    assert breaker.admit(now=probe_at + timedelta(seconds=60)).probe


def test_a_probe_whose_worker_died_is_replaced_after_the_probe_timeout():
    open_it()
    probe_at = T0 + timedelta(seconds=60)
    assert view().admit(now=probe_at).probe
    assert not view().admit(now=probe_at + timedelta(seconds=12)).allowed
    assert view().admit(now=probe_at + timedelta(seconds=13)).probe


def test_a_closed_clean_proven_breaker_costs_a_dispatch_no_query(django_assert_num_queries):
    breaker = Breaker(name=NAME, config=BreakerConfig(**{**CONFIG.__dict__, "refresh_seconds": 60}))
    breaker.record_success(probe=False, now=T0)  # writes last_success_at
    breaker.view(fresh=True)  # the run's read
    with django_assert_num_queries(0):
        for n in range(100):
            at = T0 + timedelta(seconds=n * 0.2)  # within half a cool-down of that write
            assert breaker.admit(now=at).allowed
            breaker.record_success(probe=False, now=at)
            assert breaker.claim_limit(4, now=at) == 4
    # Half a cool-down later, the next render accepted writes it again: about twice per
    # cool-down, not once per render.
    with django_assert_num_queries(4):  # SET LOCAL lock_timeout and UPDATE, in a savepoint
        breaker.record_success(probe=False, now=T0 + timedelta(seconds=31))


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
    # Nothing has proven the service healthy: the first refused call opens the breaker (one
    # slot here); the row claimed ahead is released without a call, the other six are not
    # even claimed. Nobody is charged: the service failed, not they.
    assert report.claimed == 2 and report.breaker == "open"
    assert report.count(AttemptOutcome.SKIPPED) == 1
    assert sum(fake_renderer.stats()["posts_by_key"].values()) == 0  # down: nothing arrived
    assert set(RecapSideEffect.objects.values_list("attempts", flat=True)) == {0}
    assert RecapSideEffect.objects.filter(wait_reason="breaker").count() == 2
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
    open_it()  # another process opened the breaker after our claim
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
    open_it()
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

    breaker = proven()
    fail(breaker, 1)
    with psycopg.connect(database_dsn()) as holder:
        holder.execute("SELECT 1 FROM outbox_circuit_breakers FOR UPDATE")
        started = time.monotonic()
        # Judged on what it last saw (closed: the caller's own backoff); never raises.
        assert fail(view(), 2) is None and time.monotonic() - started < 3
        holder.rollback()
    assert CircuitBreaker.objects.get(name=NAME).failing_rows == [1]


@pytest.mark.django_db(transaction=True)
def test_the_breaker_row_locked_while_a_row_fails_charges_no_row(fake_renderer, paid_recap):
    """A failed breaker write never charges the row: it is released uncharged, as every
    answer about the service is (issue 27, finding 5)."""
    import psycopg

    fake_renderer.configure(mode="error_5xx")
    _, row = paid_recap()
    with psycopg.connect(database_dsn()) as holder:
        holder.execute("SELECT 1 FROM outbox_circuit_breakers FOR UPDATE")
        report = dispatch_run(now=T0)
        holder.rollback()
    row.refresh_from_db()
    assert report.count(AttemptOutcome.SERVICE_UNAVAILABLE) == 1
    assert (row.status, row.attempts, row.wait_reason) == ("pending", 0, "breaker")
    assert row.first_failed_at is None and row.waiting_since == T0


@pytest.mark.parametrize("status", [404, 409, 307, 400])
def test_a_deploys_answer_to_the_probe_does_not_close_the_breaker(
    fake_renderer, paid_recap, status
):
    """Only a render accepted proves the service works (issue 27): a 3xx/4xx from a deploy
    in progress, to the half-open probe, opens the breaker for another cool-down instead of
    closing it, and the probe row is not charged."""
    _, row = paid_recap()
    open_it()
    fake_renderer.configure(mode="answer", status=status)
    report = dispatch_run(now=T0 + timedelta(seconds=61))
    row.refresh_from_db()
    assert report.claimed == 1 and report.breaker == "open"
    assert fake_renderer.health_checks == 1 and sum(fake_renderer.posts_by_key.values()) == 1
    assert (row.status, row.attempts, row.last_error_class) == ("pending", 0, f"http_{status}")
    breaker = CircuitBreaker.objects.get(name=NAME)
    assert breaker.open_until == T0 + timedelta(seconds=121)
