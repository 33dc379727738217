"""Client-side bounds on database waits (kernel/db, issue 8 findings 5 and 6).

The frozen-server tests run against a throw-away PostgreSQL cluster (tests/support/
pg_cluster.py) whose processes are SIGSTOPped: the kernel still accepts and ACKs, nothing
answers, so only a bound on our side can end the wait. They take about 15 s in all (the
cluster's start and drop included); the reconnect tests use the suite's own database.
"""

import select
import time
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import OperationalError, connection

from ingress.models import RawEvent
from ingress.services import raw_event_store
from ingress.sources import all_sources
from kernel.db import database_deadline
from kernel.db.postgresql.base import BoundedConnection, DatabaseWrapper
from outbox.checks import time_budget_violations
from tests.support.pg_cluster import throwaway_cluster

# What a bounded wait may overrun its bound by on a busy 2-core CI machine.
MARGIN_SECONDS = 0.5


@pytest.fixture(scope="module")
def throwaway():
    with throwaway_cluster(prefix="edbounds") as cluster:
        yield cluster


@pytest.fixture
def cluster(throwaway, django_db_blocker):
    """The throw-away cluster, reachable through our own DatabaseWrappers (pytest-django
    blocks every connection outside its fixtures, these included)."""
    with django_db_blocker.unblock():
        yield throwaway


@contextmanager
def frozen(cluster):
    cluster.freeze()
    try:
        yield
    finally:
        cluster.thaw()


def wrapper_for(cluster, **options) -> DatabaseWrapper:
    """Our backend against the throw-away cluster, with the production OPTIONS shape."""
    settings_dict = {
        **connection.settings_dict,
        "NAME": "postgres",
        "USER": "postgres",
        "PASSWORD": "",
        "HOST": "127.0.0.1",
        "PORT": str(cluster.port),
        "OPTIONS": {
            "connect_timeout": 3,
            "options": "-c statement_timeout=15000",
            "client_wait_timeout": 20.0,
            **options,
        },
    }
    return DatabaseWrapper(settings_dict, alias="bounds")


def elapsed(call) -> tuple[float, Exception | None]:
    started = time.monotonic()
    try:
        call()
    except Exception as exc:  # returned for the test to assert on
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def select_one(wrapper: DatabaseWrapper) -> None:
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT 1")


# --- a frozen server ------------------------------------------------------------------------


@pytest.mark.faults
def test_a_query_on_a_frozen_server_ends_at_the_client_wait_timeout(cluster):
    wrapper = wrapper_for(cluster, client_wait_timeout=1.0)
    select_one(wrapper)  # connected and answered while the server runs
    with frozen(cluster):
        seconds, error = elapsed(lambda: select_one(wrapper))
    assert isinstance(error, OperationalError)
    assert "client-side bound" in str(error)
    assert 1.0 <= seconds < 1.0 + MARGIN_SECONDS
    # The half-read connection is never used again; the next query gets a new one.
    assert not wrapper.is_usable()
    wrapper.close()
    select_one(wrapper)
    wrapper.close()


@pytest.mark.faults
def test_sending_a_large_statement_to_a_frozen_server_is_bounded_too(cluster):
    """4 MiB fill the socket buffers of a server that reads nothing: the send is a wait as
    well, and giving up (closing the connection) must not block on the full socket."""
    wrapper = wrapper_for(cluster, client_wait_timeout=1.0)
    select_one(wrapper)
    with frozen(cluster):
        seconds, error = elapsed(
            lambda: wrapper.cursor().execute("SELECT length(%s::bytea)", [b"x" * (4 * 1024 * 1024)])
        )
    assert isinstance(error, OperationalError)
    assert 1.0 <= seconds < 1.0 + MARGIN_SECONDS
    wrapper.close()


@pytest.mark.faults
def test_a_deadline_bounds_a_commit_tighter_than_the_connection_bound(cluster):
    wrapper = wrapper_for(cluster)  # client_wait_timeout 20 s
    wrapper.set_autocommit(False)
    select_one(wrapper)  # a transaction is open
    with frozen(cluster):
        # Timed from the deadline's start, not the commit's: the deadline is armed first,
        # so the commit alone may take a hair under 0.5 s (CI saw 0.49995 s).
        started = time.monotonic()
        with database_deadline(0.5):
            _, error = elapsed(wrapper.commit)
        seconds = time.monotonic() - started
    assert isinstance(error, OperationalError)
    assert 0.5 <= seconds < 0.5 + MARGIN_SECONDS
    wrapper.close()


@pytest.mark.faults
def test_connecting_to_a_frozen_server_fits_the_deadline(cluster):
    wrapper = wrapper_for(cluster)  # connect_timeout 3 s
    with frozen(cluster), database_deadline(2.5):
        seconds, error = elapsed(wrapper.ensure_connection)
    assert isinstance(error, OperationalError)
    # libpq waits whole seconds: what fits into 2.5 s is 2 s.
    assert 2.0 <= seconds < 2.0 + MARGIN_SECONDS


@pytest.mark.faults
def test_no_connect_is_started_when_less_than_libpq_minimum_is_left(cluster):
    wrapper = wrapper_for(cluster)
    with database_deadline(1.5):
        seconds, error = elapsed(wrapper.ensure_connection)
    assert isinstance(error, OperationalError)
    assert "too little to open a connection" in str(error)
    assert seconds < 0.1


@pytest.mark.faults
def test_the_health_check_is_no_round_trip(cluster):
    wrapper = wrapper_for(cluster)
    select_one(wrapper)
    with frozen(cluster):
        # A `SELECT 1` would hang here until a timeout; the socket poll answers at once.
        seconds, _ = elapsed(lambda: wrapper.is_usable() or pytest.fail("deemed unusable"))
    assert seconds < 0.05
    wrapper.close()


# --- a server that hung up (restart, terminate) ----------------------------------------------


def _terminate_backend_and_wait_for_the_hangup(wrapper) -> int:
    """End the wrapper's session from another connection, as a restart would; return once
    the goodbye has reached our socket."""
    pid = wrapper.connection.info.backend_pid
    with wrapper.get_new_connection(wrapper.get_connection_params()) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    poller = select.poll()
    poller.register(wrapper.connection.fileno(), select.POLLIN)
    assert poller.poll(5000), "the server never closed the terminated session"
    return pid


@pytest.mark.django_db
def test_the_health_check_sees_a_connection_the_server_closed():
    RawEvent.objects.exists()
    _terminate_backend_and_wait_for_the_hangup(connection)
    assert not connection.is_usable()


def test_a_webhook_after_the_server_closed_the_connection_is_stored(client, transactional_db):
    """Between two requests the server ends the session (a restart): the next webhook gets a
    new connection before its INSERT, not a 503 (finding 6)."""
    RawEvent.objects.exists()
    old_pid = _terminate_backend_and_wait_for_the_hangup(connection)

    response = client.generic(
        "POST",
        "/webhooks/stripe/",
        b'{"id": "evt_after_restart"}',
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE="t=1700000000,v1=deadbeef",
    )

    assert response.status_code == 202
    assert connection.connection.info.backend_pid != old_pid
    event = RawEvent.objects.get(pk=response.json()["id"])
    assert bytes(event.body) == b'{"id": "evt_after_restart"}'


def test_raw_event_store_reconnects_once_when_the_connection_broke(transactional_db):
    """A dead connection the health check did not catch (it ran before the hang-up) breaks
    on the INSERT itself: the store reconnects once and inserts again."""
    RawEvent.objects.exists()
    # The check already passed for this request (an attribute since Django 4.1 that
    # django-stubs does not declare).
    connection.health_check_done = True  # type: ignore[attr-defined]
    _terminate_backend_and_wait_for_the_hangup(connection)

    event = raw_event_store(
        source=all_sources()["stripe"],
        method="POST",
        path="/webhooks/stripe/",
        query_string="",
        headers={"stripe-signature": "t=1,v1=00"},
        body=b'{"id": "evt_retried"}',
        remote_addr="127.0.0.1",
    )

    stored = [(pk, bytes(body)) for pk, body in RawEvent.objects.values_list("pk", "body")]
    assert stored == [(event.pk, b'{"id": "evt_retried"}')]


def test_raw_event_store_does_not_retry_on_a_refused_connection(transactional_db):
    saved = {key: connection.settings_dict[key] for key in ("HOST", "PORT")}
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT="1")  # nothing listens there
    try:
        with pytest.raises(OperationalError):
            raw_event_store(
                source=all_sources()["stripe"],
                method="POST",
                path="/webhooks/stripe/",
                query_string="",
                headers={},
                body=b"{}",
                remote_addr=None,
            )
    finally:
        connection.close()
        connection.settings_dict.update(saved)


# --- the budget ------------------------------------------------------------------------------


def test_the_webhook_store_deadline_is_held_to_the_request_budget(settings):
    settings.WEBHOOK_STORE_TIMEOUT_SECONDS = 31.0
    (violation,) = time_budget_violations()
    assert violation.message == (
        "ingress.raw_event_store worst case store deadline 31.0 s (the wait in the queue or "
        "for a connection, the INSERT and one reconnect all inside it) = 31.0 s exceeds the "
        "30.0 s budget of the webhook receive request (WEBHOOK_REQUEST_BUDGET_SECONDS)."
    )


def test_the_default_webhook_store_deadline_fits():
    assert time_budget_violations() == []


def test_a_store_deadline_too_short_to_connect_is_refused_at_check(settings):
    settings.WEBHOOK_STORE_TIMEOUT_SECONDS = 2.0
    with pytest.raises(SystemCheckError, match=r"eventdrop\.E001"):
        call_command("check")


@pytest.mark.django_db
def test_every_process_on_postgresql_gets_the_bounded_backend():
    """The settings every process (web, inbox, qcluster, commands) starts from."""
    database = connection.settings_dict
    options = database["OPTIONS"]
    assert database["ENGINE"] == "kernel.db.postgresql"
    assert database["CONN_HEALTH_CHECKS"] is True  # the poll(2), not a SELECT 1
    assert options["client_wait_timeout"] == 15.0 + 5.0  # statement_timeout + margin
    assert options["options"] == "-c statement_timeout=15000"
    assert options["keepalives"] == 1
    assert options["tcp_user_timeout"] == 20000
    RawEvent.objects.exists()
    assert isinstance(connection.connection, BoundedConnection)
    assert connection.connection.client_wait_timeout == 20.0
