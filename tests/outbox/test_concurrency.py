"""Several dispatchers at once on PostgreSQL, with real threads and the real fake service."""

import threading

import pytest
from django.db import connection

from outbox.dispatcher import dispatch_run
from outbox.models import RecapSideEffect
from tests.recaps.fixtures import T0

pytestmark = pytest.mark.django_db(transaction=True)


def run_in_threads(count: int, work) -> tuple[list, list[BaseException]]:
    results: list = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def worker():
        try:
            barrier.wait(timeout=10)
            results.append(work())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results, errors


def test_two_dispatchers_over_one_backlog_never_dispatch_a_row_twice(
    fake_renderer, paid_recap, settings
):
    settings.RENDER_MAX_CONCURRENCY = 4
    # Eight calls at once on a shared machine: generous limits, so that only a real double
    # dispatch (not a slow answer) can fail this test.
    settings.RENDER_READ_TIMEOUT_SECONDS = 5.0
    settings.RENDER_TIMEOUT_SECONDS = 6.0
    # The fake's listen backlog is small: a dropped SYN is retried after 1 s.
    settings.RENDER_CONNECT_TIMEOUT_SECONDS = 3.0
    # Each render takes a little while, so both dispatchers are busy at the same time.
    fake_renderer.configure(mode="slow", delay=0.05)
    rows = [paid_recap()[1] for _ in range(40)]

    reports, errors = run_in_threads(2, lambda: dispatch_run(now=T0, budget_seconds=30))

    assert errors == []
    assert sorted(r.claimed for r in reports)[0] > 0  # both took part
    assert sum(r.claimed for r in reports) == 40
    assert RecapSideEffect.objects.filter(status="done", attempts=1).count() == 40
    assert set(fake_renderer.posts_by_key) == {row.idempotency_key for row in rows}
    assert set(fake_renderer.posts_by_key.values()) == {1}  # no row went out twice
    assert len(fake_renderer.renders) == 40


def test_the_bulkhead_caps_concurrent_render_calls(fake_renderer, paid_recap, settings):
    settings.RENDER_MAX_CONCURRENCY = 3
    fake_renderer.configure(mode="slow", delay=0.2)
    for _ in range(9):
        paid_recap()
    report = dispatch_run(now=T0)
    assert report.claimed == 9 and report.count("done") == 9
    assert fake_renderer.max_in_flight == 3


def test_two_dispatchers_with_four_slots_each_in_an_outage_charge_no_row(
    fake_renderer, paid_recap, settings
):
    # Eight calls in flight at once against a 500ing service behind a green health check:
    # the breaker (one shared row, optimistic writes) opens once, and no call is charged —
    # an answer about the service never is (issue 27).
    from datetime import timedelta

    from outbox.models import CircuitBreaker

    settings.RENDER_MAX_CONCURRENCY = 4
    settings.RENDER_CONNECT_TIMEOUT_SECONDS = 3.0  # the fake's listen backlog is small
    fake_renderer.configure(mode="error_5xx")
    for _ in range(40):
        paid_recap()

    reports, errors = run_in_threads(2, lambda: dispatch_run(now=T0, budget_seconds=30))

    assert errors == [] and {report.breaker for report in reports} == {"open"}
    assert CircuitBreaker.objects.get().state == "open"
    assert set(RecapSideEffect.objects.values_list("status", flat=True)) == {"pending"}
    charged = [
        (row.id, [(h.number, h.outcome, h.error_class) for h in row.history.all()])
        for row in RecapSideEffect.objects.exclude(attempts=0)
    ]
    assert charged == [], (charged, CircuitBreaker.objects.values().get())
    # Far fewer than 40 calls: the breaker stopped both dispatchers.
    assert sum(fake_renderer.posts_by_key.values()) <= 5 + 2 * 4 * 2

    # After the cool-down, one probe renders; the rest follow, one charged attempt each.
    fake_renderer.configure(mode="ok")
    later = T0 + timedelta(minutes=5)
    _, errors = run_in_threads(2, lambda: dispatch_run(now=later, budget_seconds=30))
    assert errors == []
    # The dispatcher that lost the race for the probe released its row until the probe's
    # deadline; the next run takes it.
    dispatch_run(now=later + timedelta(minutes=1))
    assert set(RecapSideEffect.objects.values_list("status", flat=True)) == {"done"}
    # One charged attempt each, the one that rendered (a connect timeout of the recovery
    # itself on a crowded machine, the fake's listen backlog being small, is not charged).
    assert set(RecapSideEffect.objects.values_list("attempts", flat=True)) == {1}
    assert len(fake_renderer.renders) == 40
