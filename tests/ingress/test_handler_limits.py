"""A handler's rate and concurrency, and a downstream's 429 (issue 41): kept by PostgreSQL in
the claim, so they hold with any number of workers; a 429 slows the handler and never
charges the row. In-process on PostgreSQL, the clock passed in; several workers and a real
rate-limited downstream on real processes: tests/ingress/test_handler_limits_processes.py."""

import threading
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from ingress.checks import check_handler_limits
from ingress.deliveries import deliveries_claim, deliveries_run_due
from ingress.deliveries.pace import handler_limits, limited_handlers
from ingress.handlers import DownstreamRateLimited, get_handler, unregister, webhook_handler
from ingress.inbox import inbox_run_once
from ingress.models import Delivery, HandlerPace
from tests.ingress.test_fair_share import pending_deliveries, store_github

pytestmark = pytest.mark.django_db


class Downstream:
    """Stands in for a handler's downstream: counts calls, how many at once, and can answer
    429 for a while."""

    def __init__(self, *, seconds: float = 0.0):
        self.calls: list[int] = []
        self.running = 0
        self.most_at_once = 0
        self.seconds = seconds
        self.limited: float | None = None  # Retry-After while it answers 429
        self.lock = threading.Lock()

    def __call__(self, event, payload):
        with self.lock:
            if self.limited is not None:
                raise DownstreamRateLimited(retry_after=self.limited)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
            self.calls.append(event.id)


def register(name: str, downstream, **limits) -> str:
    def handler(event, payload):
        return downstream(event, payload)

    handler.__qualname__ = name
    webhook_handler(provider="github", event_types=["ping"], **limits)(handler)
    return f"{handler.__module__}.{name}"


@pytest.fixture
def handlers():
    names: list[str] = []

    def make(name: str, downstream, **limits) -> str:
        names.append(register(name, downstream, **limits))
        return names[-1]

    yield make
    for name in names:
        unregister(name)


def test_a_rate_takes_at_most_its_tokens_and_refills_with_time(handlers, settings):
    settings.HANDLER_RATE_BURST_SECONDS = 0.5
    name = handlers("paced", Downstream(), rate=10)
    now = timezone.now()
    pending_deliveries(name, 50, due=now)
    assert len(deliveries_claim(limit=500, now=now)) == 5  # a full burst: half a second
    assert deliveries_claim(limit=500, now=now) == []
    assert len(deliveries_claim(limit=500, now=now + timedelta(seconds=0.3))) == 3
    assert len(deliveries_claim(limit=500, now=now + timedelta(seconds=60))) == 5  # the cap
    assert HandlerPace.objects.get(handler=name).tokens == 0


def test_a_concurrency_counts_what_is_in_flight_across_claims(handlers):
    """One a claim (a worker runs its batch's deliveries one after another), at most the
    concurrency in flight across claims."""
    name = handlers("narrow", Downstream(), concurrency=3)
    now = timezone.now()
    pending_deliveries(name, 10, due=now)
    first = [deliveries_claim(limit=500, now=now) for _ in range(4)]
    assert [len(claims) for claims in first] == [1, 1, 1, 0]  # three in flight
    Delivery.objects.complete(first[0] + first[1], now=now)
    assert [len(deliveries_claim(limit=500, now=now)) for _ in range(3)] == [1, 1, 0]


def test_a_limited_handler_leaves_the_batch_to_the_others(handlers):
    paced = handlers("paced_busy", Downstream(), rate=1)
    free = handlers("free", Downstream())
    now = timezone.now()
    pending_deliveries(paced, 20, due=now - timedelta(minutes=1))
    quiet = pending_deliveries(free, 5, due=now)
    claims = deliveries_claim(limit=10, now=now)
    assert sorted(claim.handler for claim in claims) == sorted([paced] + [free] * 5)
    assert {claim.id for claim in claims} >= {d.id for d in quiet}


def test_settings_override_the_declared_limits(handlers, settings):
    name = handlers("overridden", Downstream(), rate=5, concurrency=2)
    settings.HANDLER_LIMITS = {name: {"rate": None, "concurrency": 7, "replay_volume": 100}}
    spec = get_handler(name)
    assert spec is not None
    limits = handler_limits(spec)
    assert (limits.rate, limits.concurrency, limits.replay_volume) == (None, 7, 100)
    settings.HANDLER_LIMITS = {name: {"concurrency": None, "rate": None}}
    assert name not in limited_handlers()


def test_a_limited_handler_is_never_run_at_settle(handlers):
    downstream = Downstream()
    name = handlers("paced_settle", downstream, rate=100)
    store_github(3, prefix="settle")
    result = inbox_run_once()
    assert result.verified == 3
    # Created pending, then run by the claim within the same pass (the rate allows it).
    assert set(Delivery.objects.filter(handler=name).values_list("status", flat=True)) == {"done"}
    assert HandlerPace.objects.filter(handler=name).exists()
    assert len(downstream.calls) == 3


def test_a_429_releases_the_row_uncharged_and_slows_the_handler(handlers, settings):
    settings.HANDLER_RATE_BURST_SECONDS = 1.0
    settings.HANDLER_SLOWDOWN_SECONDS = 60.0
    downstream = Downstream()
    name = handlers("limited_downstream", downstream, rate=10)
    other = Downstream()
    free = handlers("free_neighbour", other)
    now = timezone.now()
    pending_deliveries(name, 30, due=now)
    downstream.limited = 30.0  # 429, Retry-After: 30
    deliveries_run_due(limit=1, now=now)  # one row: the claim takes the oldest delivery
    (released,) = Delivery.objects.filter(handler=name).exclude(next_attempt_at__lte=now)
    assert (released.status, released.attempts) == ("pending", 0)  # uncharged
    assert released.next_attempt_at >= now + timedelta(seconds=29)
    assert [a.outcome for a in released.history.all()] == ["released"]
    pace = HandlerPace.objects.get(handler=name)
    assert pace.not_before is not None
    assert pace.not_before >= timezone.now() + timedelta(seconds=29)
    assert (pace.factor, pace.tokens, pace.rate_limited) == (0.5, 0.0, 1)

    # While the pause lasts nothing of it is claimed; its neighbour goes on.
    fresh = pending_deliveries(free, 2, due=now)
    later = timezone.now() + timedelta(seconds=5)
    claims = deliveries_claim(limit=500, now=later)
    assert {claim.id for claim in claims} == {d.id for d in fresh}

    # After it, at half the rate: 5 a second, a burst of 5.
    downstream.limited = None
    after = timezone.now() + timedelta(seconds=31)
    assert len(deliveries_claim(limit=500, now=after)) == 5
    # Once the slow-down is over, the whole rate again.
    recovered = after + timedelta(seconds=61)
    assert len(deliveries_claim(limit=500, now=recovered)) == 10
    assert Delivery.objects.filter(handler=name, attempts__gt=1).count() == 0


def test_a_429_pauses_an_unlimited_handler_and_its_settle_runs(handlers, settings):
    downstream = Downstream()
    name = handlers("unlimited_downstream", downstream)
    store_github(1, prefix="first")
    downstream.limited = 20.0
    inbox_run_once()  # at settle: 429, then the claim releases it and pauses the handler
    inbox_run_once()
    pace = HandlerPace.objects.get(handler=name)
    assert pace.not_before is not None
    assert pace.not_before > timezone.now() + timedelta(seconds=15)
    downstream.limited = None
    store_github(2, prefix="second")
    inbox_run_once()  # neither run at settle nor claimed while the pause lasts
    assert downstream.calls == []
    assert Delivery.objects.filter(handler=name, attempts__gt=0).count() == 0


@pytest.mark.django_db(transaction=True)
def test_the_concurrency_holds_with_several_workers_at_once(handlers):
    """Four workers (threads, each with its own connection) claim and run at once; the
    handler's downstream never sees more than its concurrency in flight."""
    downstream = Downstream(seconds=0.05)
    name = handlers("four_workers", downstream, concurrency=2)
    pending_deliveries(name, 24, due=timezone.now())
    errors: list[BaseException] = []

    def worker():
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and Delivery.objects.filter(
                handler=name, status__in=["pending", "processing"]
            ).exists():
                deliveries_run_due(limit=3)
        except BaseException as exc:  # the test fails on it
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(downstream.calls) == 24 == len(set(downstream.calls))
    assert downstream.most_at_once <= 2


def test_check_holds_a_rate_to_the_replay_slo(handlers, settings):
    settings.BULK_JOB_REPLAY_SLO_SECONDS = 120
    slow = handlers("slow_replay", Downstream(), rate=10, replay_volume=5000)
    handlers("undeclared", Downstream(), rate=50)
    messages = check_handler_limits()
    assert [(m.id, slow in m.msg) for m in messages if m.id == "ingress.E017"] == [
        ("ingress.E017", True)
    ]
    (warning,) = [m for m in messages if m.id == "ingress.W017"]
    assert "6,000" in warning.msg  # 50 a second for 120 s
    settings.HANDLER_LIMITS = {slow: {"rate": 50}}
    assert not [m for m in check_handler_limits() if m.id == "ingress.E017"]


def test_check_refuses_an_override_that_cannot_work(handlers, settings):
    name = handlers("bad_override", Downstream())
    overrides: list[object] = [{"rate": 0}, {"concurrency": 0}, {"rate": "fast"}, {"burst": 3}, []]
    for override in overrides:
        settings.HANDLER_LIMITS = {name: override}
        assert [m.id for m in check_handler_limits()] == ["ingress.E017"], override
    settings.HANDLER_LIMITS = {"no.such.handler": {"rate": 1}}
    assert [m.id for m in check_handler_limits()] == ["ingress.E017"]


def test_a_handler_declared_with_a_limit_that_cannot_work_is_refused():
    for limits in ({"rate": 0}, {"rate": -1}, {"concurrency": 0}, {"replay_volume": 1.5}):
        with pytest.raises(ValueError):
            webhook_handler(provider="github", event_types=["ping"], **limits)


def test_list_handlers_prints_the_limits(handlers, capsys):
    handlers("listed", Downstream(), rate=20, concurrency=4)
    call_command("list_handlers")
    out = capsys.readouterr().out
    assert "rate 20/s" in out and "concurrency 4" in out
