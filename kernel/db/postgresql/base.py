"""Django's PostgreSQL backend, with a client-side bound on every wait for the server.

ENGINE `kernel.db.postgresql`. It differs from `django.db.backends.postgresql` in three
places, all for a server that stops answering or restarts (issue 8, findings 5 and 6):

1. Connections are `BoundedConnection`s. psycopg funnels every wait on an open connection
   (execute, fetch, commit, rollback, the health check's own queries) through one method,
   `Connection.wait()`, whose loop already takes a timeout; we give it one: the connection's
   `client_wait_timeout` (OPTIONS; settings derive it from statement_timeout plus a margin,
   so the server's own cancel normally comes first) or the current `database_deadline()`,
   whichever ends first. No watchdog thread, nothing armed per query: the bound costs one
   ContextVar read and one clock read per wait. When it expires the connection is closed
   (it is mid-message, unusable) and `DatabaseWaitTimeout`, an OperationalError, is raised.
   `wait()` is a public method of psycopg's connection classes but not in psycopg's
   documentation: what it costs not to override it is a watchdog per query (a timer that
   closes the socket), which a frozen server makes the common path. No private name of
   psycopg is used, and tests/eventdrop/test_db_bounds.py fails if an upgrade changes it.
2. A connection opened inside a deadline gets a libpq connect_timeout that fits what is
   left of it, and none is started when less than libpq's 2 s minimum is left. The timeout
   is per address tried: give HOST as an address (as DATABASE_URL does here) or a name with
   one address, or a connect can take that long once per address, plus the DNS lookup.
3. `is_usable()`, Django's health check (CONN_HEALTH_CHECKS, once per request before the
   first query), polls the idle socket instead of sending `SELECT 1`: an idle connection
   has nothing to read, so a readable socket means the server hung up (restart, crash,
   pg_terminate_backend, idle timeout). One poll(2), no round trip.

4. Behind PgBouncer in transaction pooling mode (OPTIONS["pooler"] = "pgbouncer", set by
   DATABASE_POOLER): no session state survives a transaction, and PgBouncer refuses the libpq
   `options` startup parameter that carries statement_timeout otherwise. So the timeout is
   not sent; it must be the database's own default (`manage.py database_timeouts`: ALTER
   DATABASE … SET statement_timeout, applied by PostgreSQL to every server connection
   PgBouncer opens), and every new connection checks that the server really applies it, at
   most the cap the settings ask for — else the connection is closed and refused
   (`ServerTimeoutMismatch`, an OperationalError: a 503 on the webhook path, a backoff in
   the workers), so no process ever runs uncapped statements unnoticed. The client-side
   bounds above are unchanged: PgBouncer queueing a query for a busy or frozen server is one
   more wait that `wait()` ends.

5. `open_async_connection()` opens a `BoundedAsyncConnection` (psycopg's asyncio connection,
   with the same bounded `wait()`) from a DATABASES entry, exactly as this backend would open
   its own connection: the same parameters, role, connect timeout fitted to the deadline and,
   behind a pooler, the same statement_timeout check. The receive path's group commit on the
   web server's event loop (ingress/store.py) writes through these.

Not supported: Django's connection pool (OPTIONS["pool"]); the bound lives on the
connection class, which the pool would choose itself.
"""

import math
import re
import select
import time
from typing import Any

import psycopg
import psycopg.sql
from django.core.exceptions import ImproperlyConfigured
from django.db.backends.postgresql import base

from kernel.db.bounds import deadline_seconds_left

# libpq (and psycopg after it) treats any connect_timeout below 2 s as 2 s.
LIBPQ_MIN_CONNECT_TIMEOUT_SECONDS = 2
# How often `wait()` wakes while the socket is silent, as psycopg's own default does: only
# the granularity of the bound, not the bound.
WAIT_INTERVAL_SECONDS = 0.1


POOLERS = ("pgbouncer",)
_STATEMENT_TIMEOUT_OPTION = re.compile(r"^\s*-c\s*statement_timeout\s*=\s*(\d+)\s*$")


class DatabaseWaitTimeout(psycopg.OperationalError):
    """The server did not answer within a client-side bound; the connection was closed."""


class ServerTimeoutMismatch(psycopg.OperationalError):
    """Behind a pooler, the server's statement_timeout is not the cap the settings ask for."""


def pooled_statement_timeout_ms(options: str) -> int:
    """The statement_timeout (ms) that `options` asks for, which a pooler cannot carry: it
    may hold nothing else, since PgBouncer would drop every other startup setting too."""
    match = _STATEMENT_TIMEOUT_OPTION.match(options or "")
    if match is None:
        raise ImproperlyConfigured(
            f"Behind a pooler OPTIONS['options'] may only set statement_timeout, got "
            f"{options!r}: PgBouncer does not pass startup settings to the server."
        )
    return int(match.group(1))


class BoundedConnection(psycopg.Connection):
    # Set right after connecting (DatabaseWrapper.get_new_connection); None: only deadlines.
    client_wait_timeout: float | None = None

    def wait(self, gen, interval=WAIT_INTERVAL_SECONDS, timeout=None):
        bound = _wait_bound(self.client_wait_timeout)
        if bound is None or (timeout is not None and timeout <= bound):
            # A caller with its own, tighter timeout (psycopg's notifies()) handles its
            # expiry itself: the generator it abandons leaves the connection usable.
            return super().wait(gen, interval, timeout)
        started = time.monotonic()
        try:
            return super().wait(gen, interval, bound)
        except psycopg.OperationalError:
            # psycopg names its wait's timeout with a private class: an OperationalError
            # raised once the bound has passed is that timeout; earlier, the server's own.
            if time.monotonic() - started < bound:
                raise
            # The request is sent and its answer half-read at best: the connection cannot
            # be used again. If the server runs the statement later anyway (it was frozen,
            # not dead), that is the ambiguity of a connection lost after COMMIT was sent,
            # which every writer must survive anyway: the caller saw an error and retries
            # (a webhook stored twice is one event after the inbox's dedup).
            self.close()
            raise DatabaseWaitTimeout(
                f"the database did not answer within {bound:.2f} s (client-side bound)"
            ) from None


class BoundedAsyncConnection(psycopg.AsyncConnection):
    """BoundedConnection's bound, on psycopg's asyncio connection (ingress/store.py).

    Not a task cancellation: psycopg answers a cancelled wait by asking the server to cancel
    and then waiting up to 10 s for it, which a frozen server never answers. The wait's own
    timeout ends it on our clock and the connection is closed.
    """

    client_wait_timeout: float | None = None

    async def wait(self, gen, interval=WAIT_INTERVAL_SECONDS, timeout=None):
        bound = _wait_bound(self.client_wait_timeout)
        if bound is None or (timeout is not None and timeout <= bound):
            return await super().wait(gen, interval, timeout)
        started = time.monotonic()
        try:
            return await super().wait(gen, interval, bound)
        except psycopg.OperationalError:
            if time.monotonic() - started < bound:  # the server's error, not our bound
                raise
            await self.close()
            raise DatabaseWaitTimeout(
                f"the database did not answer within {bound:.2f} s (client-side bound)"
            ) from None


def _wait_bound(client_wait_timeout: float | None) -> float | None:
    """The tighter of a connection's own bound and what is left of the current deadline."""
    left = deadline_seconds_left()
    if left is not None and (client_wait_timeout is None or left < client_wait_timeout):
        return left
    return client_wait_timeout


def _fit_connect_timeout(conn_params: dict) -> None:
    """A connect inside a deadline gets a libpq connect_timeout that fits what is left."""
    left = deadline_seconds_left()
    if left is None:
        return
    fits = math.floor(left)
    if fits < LIBPQ_MIN_CONNECT_TIMEOUT_SECONDS:
        raise DatabaseWaitTimeout(
            f"{left:.2f} s left of the deadline: too little to open a connection "
            f"(libpq waits at least {LIBPQ_MIN_CONNECT_TIMEOUT_SECONDS} s)"
        )
    configured = int(conn_params.get("connect_timeout") or fits)
    conn_params["connect_timeout"] = min(configured, fits)


_SERVER_STATEMENT_TIMEOUT = (
    "SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'"
)


def _timeout_mismatch(server_ms: int, expected: int) -> ServerTimeoutMismatch | None:
    if 0 < server_ms <= expected:
        return None
    return ServerTimeoutMismatch(
        f"statement_timeout on the server is {server_ms} ms behind the pooler, the settings "
        f"ask for {expected} ms (0 < server <= settings): run `manage.py "
        f"database_timeouts` (ALTER DATABASE … SET statement_timeout) as the database owner."
    )


async def open_async_connection(alias: str = "default") -> BoundedAsyncConnection:
    """An autocommit asyncio connection to DATABASES[alias], opened as this backend opens
    its own (see the module docstring, 5). Within the current deadline, connecting included.

    It binds values on the server (psycopg's own cursor, not Django's client-side one).
    """
    from django.db import connections

    wrapper = connections[alias]
    params = dict(wrapper.get_connection_params())
    params.pop("cursor_factory", None)  # Django's sync cursor class; the async default binds
    client_wait_timeout = params.pop("client_wait_timeout", None)
    _fit_connect_timeout(params)
    connection = await BoundedAsyncConnection.connect(**params, autocommit=True)
    try:
        if client_wait_timeout is not None:
            connection.client_wait_timeout = float(client_wait_timeout)
        role = wrapper.settings_dict["OPTIONS"].get("assume_role")
        if role:
            await connection.execute(
                psycopg.sql.SQL("SET ROLE {}").format(psycopg.sql.Identifier(role))
            )
        expected = getattr(wrapper, "expected_statement_timeout_ms", None)
        if expected is not None:
            cursor = await connection.execute(_SERVER_STATEMENT_TIMEOUT)
            (server_ms,) = await cursor.fetchone()  # type: ignore[misc]
            mismatch = _timeout_mismatch(server_ms, expected)
            if mismatch is not None:
                raise mismatch
    except BaseException:
        await connection.close()
        raise
    return connection


class _PsycopgOpeningBoundedConnections:
    """psycopg as Django's backend sees it (`DatabaseWrapper.Database`), except that
    connect() opens a BoundedConnection. Everything else is the module itself."""

    @staticmethod
    def connect(*args: Any, **kwargs: Any) -> BoundedConnection:
        # Looked up per call: an instrumentation that wraps psycopg's connect (kernel/tracing.py)
        # after this module was imported still applies.
        return BoundedConnection.connect(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(psycopg, name)


class DatabaseWrapper(base.DatabaseWrapper):
    Database = _PsycopgOpeningBoundedConnections()
    # Behind a pooler: the statement_timeout (ms) every connection must find on the server.
    expected_statement_timeout_ms: int | None = None

    def get_connection_params(self):
        params = super().get_connection_params()
        pooler = params.pop("pooler", None)
        if pooler is None:
            return params
        if pooler not in POOLERS:
            raise ImproperlyConfigured(f"Unknown pooler {pooler!r}; supported: {POOLERS}")
        # django-stubs 5.2 lack the psycopg 3 cursor classes Django defines in this module.
        server_binding = base.ServerBindingCursor  # type: ignore[attr-defined]
        if params.get("cursor_factory") is server_binding or params.get(
            "prepare_threshold"
        ):
            # Server-side binding and prepared statements live in one server session, which
            # transaction pooling hands to another client after every transaction.
            raise ImproperlyConfigured(
                "Behind PgBouncer (transaction pooling) server_side_binding and "
                "prepare_threshold must stay unset."
            )
        self.expected_statement_timeout_ms = pooled_statement_timeout_ms(
            params.pop("options", "")
        )
        return params

    def init_connection_state(self):
        super().init_connection_state()
        expected = self.expected_statement_timeout_ms
        if expected is None:
            return
        with self.connection.cursor() as cursor:
            cursor.execute(_SERVER_STATEMENT_TIMEOUT)
            (server_ms,) = cursor.fetchone()
        mismatch = _timeout_mismatch(server_ms, expected)
        if mismatch is None:
            return
        # Closed and forgotten, so Django's next ensure_connection() opens (and checks) a new
        # one instead of using this one unchecked.
        self.connection.close()
        self.connection = None
        raise mismatch

    def get_new_connection(self, conn_params):
        conn_params = dict(conn_params)
        client_wait_timeout = conn_params.pop("client_wait_timeout", None)
        _fit_connect_timeout(conn_params)
        connection = super().get_new_connection(conn_params)
        if client_wait_timeout is not None:
            connection.client_wait_timeout = float(client_wait_timeout)
        return connection

    def is_usable(self):
        connection = self.connection
        if connection is None or connection.closed:
            return False
        poller = select.poll()
        poller.register(connection.fileno(), select.POLLIN)
        return not poller.poll(0)
