"""Reads that may go to the streaming replica (DATABASE_REPLICA_URL), and everything else.

Nothing reads from the replica unless it is asked to: `ReplicaReadsMiddleware` asks for it
on safe requests (GET, HEAD) to the read-only screens — the console's lists, searches and
pages under /admin/, the API's GET endpoints, /ops/ and /metrics — and `replica_reads()`
does for code outside a request. Even then a read stays on the primary when

- it is part of a write: writes and `select_for_update()` (every claim) are always routed to
  the primary, and so is any read inside a transaction on it (`atomic()`: the services);
- its model belongs to sign-in (users, sessions, tokens): a session just written on the
  primary must be found on the next request;
- the replica is unreachable or more than DATABASE_REPLICA_MAX_LAG_SECONDS behind (measured
  at most every REPLICA_CHECK_INTERVAL_SECONDS per process, `replica_status()`, which the ops
  page shows);
- the browser wrote within the last DATABASE_REPLICA_MAX_LAG_SECONDS (an operator action is
  a POST: it sets a cookie that pins that browser's reads to the primary for as long as the
  replica may lag, so the page after an action shows its result).

Migrations run on the primary only; the replica receives them by streaming.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.models import Model
from django.http import HttpRequest
from django.http.response import HttpResponseBase

from kernel.db import database_deadline

logger = logging.getLogger(__name__)

REPLICA_ALIAS = "replica"
# Sign-in state is written on every login and read on the next request.
PRIMARY_ONLY_APPS = frozenset({"auth", "sessions", "knox", "contenttypes"})
REPLICA_CHECK_INTERVAL_SECONDS = 5.0
# A probe connects (libpq's 2 s minimum) and asks one question; a frozen replica costs the
# one thread that probes this long, every REPLICA_CHECK_INTERVAL_SECONDS at most.
REPLICA_PROBE_DEADLINE_SECONDS = 2.5
PRIMARY_PIN_COOKIE = "eventdrop_primary_reads"
READ_ONLY_PATH_PREFIXES = ("/admin/", "/api/", "/ops/", "/metrics")

_replica_reads: ContextVar[bool] = ContextVar("eventdrop_replica_reads", default=False)

# The replica's lag in seconds: 0 when it has replayed everything it received, else the age
# of the last transaction it replayed (a replica that receives nothing while the primary is
# idle is not behind).
_LAG_SQL = """
SELECT pg_is_in_recovery(),
       CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
            ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), 0)
       END
"""


@dataclass(frozen=True)
class ReplicaStatus:
    configured: bool
    reachable: bool = False
    lag_seconds: float | None = None
    max_lag_seconds: float = 0.0
    checked_at: float = 0.0  # time.monotonic()
    error: str = ""

    @property
    def serving_reads(self) -> bool:
        return (
            self.reachable
            and self.lag_seconds is not None
            and self.lag_seconds <= self.max_lag_seconds
        )

    def describe(self) -> str:
        """One line for the ops page: who serves the read-only screens, and why."""
        if not self.configured:
            return ""
        limit = f"limit {self.max_lag_seconds:g} s"
        if self.serving_reads:
            return f"replica, {self.lag_seconds:.1f} s behind ({limit})"
        if not self.reachable:
            return f"primary: the replica is unreachable ({self.error})"
        if self.lag_seconds is None:
            return f"primary: the replica is not in recovery ({self.error})"
        return f"primary: the replica is {self.lag_seconds:.1f} s behind ({limit})"


_status_lock = threading.Lock()
_status: ReplicaStatus | None = None


def replica_configured() -> bool:
    return REPLICA_ALIAS in settings.DATABASES


def _probe() -> ReplicaStatus:
    max_lag = settings.DATABASE_REPLICA_MAX_LAG_SECONDS
    replica = connections[REPLICA_ALIAS]
    try:
        with database_deadline(REPLICA_PROBE_DEADLINE_SECONDS), replica.cursor() as cursor:
            cursor.execute(_LAG_SQL)
            in_recovery, lag = cursor.fetchone()
    except DatabaseError as exc:
        # Closed, so the next probe starts from a fresh connection.
        with contextlib.suppress(DatabaseError):
            replica.close()
        logger.warning("replica.unreachable error=%s", type(exc).__name__)
        return ReplicaStatus(True, False, None, max_lag, time.monotonic(), type(exc).__name__)
    if not in_recovery:
        # Promoted (or misconfigured): it is no replica of ours any more; reads it would
        # serve may already diverge from the primary.
        return ReplicaStatus(True, True, None, max_lag, time.monotonic(), "not_in_recovery")
    return ReplicaStatus(True, True, float(lag), max_lag, time.monotonic())


def replica_status(*, fresh: bool = False) -> ReplicaStatus:
    """The replica as last measured by this process (measured now when older than
    REPLICA_CHECK_INTERVAL_SECONDS, or when `fresh`). One thread measures; the others
    use the previous measurement meanwhile."""
    global _status
    if not replica_configured():
        return ReplicaStatus(False)
    current = _status
    stale = current is None or time.monotonic() - current.checked_at > (
        REPLICA_CHECK_INTERVAL_SECONDS
    )
    if current is not None and not (stale or fresh):
        return current
    if not _status_lock.acquire(blocking=current is None or fresh):
        # Only a non-blocking acquire can fail, and it is tried only with a measurement.
        assert current is not None
        return current
    try:
        _status = _probe()
        return _status
    finally:
        _status_lock.release()


@contextlib.contextmanager
def replica_reads() -> Iterator[None]:
    """Reads inside may be served by the replica (outside a request, e.g. a report)."""
    token = _replica_reads.set(True)
    try:
        yield
    finally:
        _replica_reads.reset(token)


class ReplicaRouter:
    def db_for_read(self, model: type[Model], **hints: Any) -> str:
        if (
            _replica_reads.get()
            and model._meta.app_label not in PRIMARY_ONLY_APPS
            and not connections[DEFAULT_DB_ALIAS].in_atomic_block
            and replica_status().serving_reads
        ):
            return REPLICA_ALIAS
        return DEFAULT_DB_ALIAS

    def db_for_write(self, model: type[Model], **hints: Any) -> str:
        # Explicit: an object read from the replica must still be saved on the primary.
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool:
        return True  # the same rows, one of them a copy

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool:
        return db == DEFAULT_DB_ALIAS


class ReplicaReadsMiddleware:
    """Safe requests to the read-only screens read from the replica (see the module's doc);
    any other request pins the browser's reads to the primary while the replica may lag."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not replica_configured():
            return self.get_response(request)
        if not request.path.startswith(READ_ONLY_PATH_PREFIXES):
            return self.get_response(request)
        safe = request.method in ("GET", "HEAD")
        if not safe or PRIMARY_PIN_COOKIE in request.COOKIES:
            response = self.get_response(request)
        else:
            with replica_reads():
                response = self.get_response(request)
        if not safe:
            response.set_cookie(
                PRIMARY_PIN_COOKIE,
                "1",
                max_age=max(1, round(settings.DATABASE_REPLICA_MAX_LAG_SECONDS)),
                secure=settings.SESSION_COOKIE_SECURE,
                httponly=True,
                samesite="Lax",
            )
        return response
