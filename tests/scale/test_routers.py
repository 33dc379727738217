"""The replica router's rules, without a database (tests/faults/test_replica.py runs them on a
real streaming replica). The replica's measured state is set by hand here."""

import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connections, router
from django.http import HttpResponse
from django.test import RequestFactory

from ingress.models import RawEvent
from kernel import routers
from kernel.routers import (
    PRIMARY_PIN_COOKIE,
    ReplicaReadsMiddleware,
    ReplicaStatus,
    replica_reads,
)

FIT = ReplicaStatus(True, True, 0.4, 30.0, time.monotonic())
BEHIND = ReplicaStatus(True, True, 45.0, 30.0, time.monotonic())
GONE = ReplicaStatus(True, False, None, 30.0, time.monotonic(), "OperationalError")


@pytest.fixture
def replica(monkeypatch):
    state = {"status": FIT}
    monkeypatch.setattr(routers, "replica_configured", lambda: True)
    monkeypatch.setattr(routers, "replica_status", lambda **kwargs: state["status"])
    return state


def test_reads_go_to_the_replica_only_when_asked_and_fit(replica):
    assert router.db_for_read(RawEvent) == "default"
    with replica_reads():
        assert router.db_for_read(RawEvent) == "replica"
        replica["status"] = BEHIND
        assert router.db_for_read(RawEvent) == "default"
        replica["status"] = GONE
        assert router.db_for_read(RawEvent) == "default"


def test_writes_claims_transactions_and_sign_in_stay_on_the_primary(replica, monkeypatch):
    with replica_reads():
        assert router.db_for_write(RawEvent) == "default"
        # select_for_update() is a query for writing: every claim runs on the primary.
        assert RawEvent.objects.select_for_update().db == "default"
        assert RawEvent.objects.all().db == "replica"
        assert router.db_for_read(get_user_model()) == "default"
        monkeypatch.setattr(connections["default"], "in_atomic_block", True)
        assert router.db_for_read(RawEvent) == "default"


def test_only_the_migrations_of_the_primary_run():
    assert router.allow_migrate("default", "ingress")
    assert not router.allow_migrate("replica", "ingress")


def run(request):
    seen = {}

    def view(request):
        seen["replica_reads"] = routers._replica_reads.get()
        return HttpResponse("ok")

    response = ReplicaReadsMiddleware(view)(request)
    return seen["replica_reads"], response


def test_the_middleware_asks_for_replica_reads_on_safe_console_requests(replica):
    factory = RequestFactory()
    assert run(factory.get("/ops/"))[0] is True
    assert run(factory.get("/api/raw-events/"))[0] is True
    assert run(factory.get("/admin/ingress/rawevent/"))[0] is True
    # Not the webhook path, whatever its method, and no cookie for providers.
    reads, response = run(factory.post("/webhooks/stripe/"))
    assert reads is False and PRIMARY_PIN_COOKIE not in response.cookies


def test_a_write_pins_the_browser_to_the_primary_for_the_lag_limit(replica, settings):
    settings.DATABASE_REPLICA_MAX_LAG_SECONDS = 30.0
    factory = RequestFactory()
    reads, response = run(factory.post("/api/raw-events/replay/"))
    assert reads is False
    assert response.cookies[PRIMARY_PIN_COOKIE]["max-age"] == 30
    pinned = factory.get("/api/raw-events/")
    pinned.COOKIES[PRIMARY_PIN_COOKIE] = "1"
    assert run(pinned)[0] is False


def test_without_a_replica_nothing_changes(monkeypatch):
    monkeypatch.setattr(routers, "replica_configured", lambda: False)
    reads, response = run(RequestFactory().post("/api/raw-events/replay/"))
    assert reads is False and PRIMARY_PIN_COOKIE not in response.cookies


def test_the_ops_line_says_who_serves_and_why():
    assert FIT.describe() == "replica, 0.4 s behind (limit 30 s)"
    assert BEHIND.describe() == "primary: the replica is 45.0 s behind (limit 30 s)"
    assert GONE.describe() == "primary: the replica is unreachable (OperationalError)"
    assert ReplicaStatus(False).describe() == ""
