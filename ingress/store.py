"""Group commit for the raw store: concurrent webhooks share one INSERT and one commit.

What limited the receive path (issue 15, docs/benchmarks.md) was not what PostgreSQL can take
but how each request used it: one INSERT, one commit, one round trip, each waited for by its
own Python thread, and each paying the ORM's per-row cost. Here the requests of one process
that are waiting to be stored at the same moment become one multi-row INSERT, committed once
(autocommit: the statement is its own transaction), and each request is answered only after
that commit, with its own row's id.

How a batch forms, without a timer and without a thread of its own (leader and followers):
the first request to arrive while no batch is being written becomes the leader and writes
everything waiting, its own row included, on its own thread's connection. Requests arriving
meanwhile queue up; when the leader's commit returns it hands the lead to the oldest of them,
which writes all that queued during that commit, and so on. So a lone request is written at
once (no added latency), and under load a batch is whatever arrived during one commit: the
busier the database, the larger the batch.

Every wait is bounded by the request's own store deadline (WEBHOOK_STORE_TIMEOUT_SECONDS):
a batch is written under the earliest deadline of its rows (eventdrop.db's
`database_deadline`: connecting, the INSERT and the one reconnect all inside it), and a
request still queued at its deadline leaves the queue unwritten and fails. A failed batch
fails every request in it (each answers 503 and its provider retries); only a lost connection
is retried, once, as before. A row the database refuses on its own (a value no column
takes) would otherwise fail its neighbours too, so such a batch is written again row by row.

Row ids: the rows of one INSERT … VALUES are inserted, and take their ids from the sequence,
in the order of the VALUES list, so the ids sorted ascending are the rows in that order
(whatever order RETURNING lists them in).

Inside a transaction (a caller's `atomic()`, tests) a row is never written on another thread's
connection: it is inserted alone, in the caller's transaction.
"""

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from eventdrop.db import database_deadline
from ingress.models import RawEvent

# A bound on one statement's size; a process has far fewer threads than this (WEB_THREADS).
MAX_ROWS_PER_BATCH = 64
# How long a request whose row is being written may wait past its own deadline for that
# write's outcome. The write itself ends by the batch's deadline (the earliest of its rows'),
# so this only covers the hand-back.
_HANDBACK_SECONDS = 0.5


class StoreTimeout(OperationalError):
    """The row was not committed within the request's store deadline (it may be later)."""


@dataclass(frozen=True)
class _Layout:
    """Every column but the key, in the model's order (so `RawEvent(pk, *values)` is the
    model's fast positional constructor): attribute and column names, a value preparer per
    column (only where Django's adaptation does anything for PostgreSQL), and the defaults:
    constants computed once, callables (timezone.now, dict) called per row."""

    names: list[str]
    columns: list[str]
    preparers: list[Callable[[Any], Any]]
    constants: list[Any]
    factories: dict[str, tuple[int, Callable[[], Any]]]
    index: dict[str, int]

    @classmethod
    def of_raw_event(cls) -> "_Layout":
        names: list[str] = []
        columns: list[str] = []
        preparers: list[Callable[[Any], Any]] = []
        constants: list[Any] = []
        factories: dict[str, tuple[int, Callable[[], Any]]] = {}
        for model_field in RawEvent._meta.concrete_fields:
            if model_field.primary_key:
                continue
            position = len(names)
            names.append(model_field.attname)
            columns.append(model_field.column)
            if model_field.get_internal_type() in ("JSONField", "GenericIPAddressField"):
                preparers.append(_adapted_by(model_field))
            else:
                preparers.append(_as_is)
            if model_field.has_default() and callable(model_field.default):
                factories[model_field.attname] = (position, model_field.default)
                constants.append(None)
            else:  # a str, a number or None: safe to share between rows
                constants.append(model_field.get_default() if model_field.has_default() else None)
        index = {name: position for position, name in enumerate(names)}
        return cls(names, columns, preparers, constants, factories, index)


def _adapted_by(model_field) -> Callable[[Any], Any]:
    return lambda value: model_field.get_db_prep_save(value, connection=connection)


def _as_is(value: Any) -> Any:
    return value


class _Row:
    __slots__ = ("deadline", "error", "lead", "pk", "taken", "values", "woken")

    def __init__(self, values: list[Any], deadline: float):
        self.values = values
        self.deadline = deadline
        self.woken = threading.Event()  # finished, or handed the lead
        self.pk: int | None = None
        self.error: BaseException | None = None
        self.lead = False  # handed the lead: write what is queued
        self.taken = False  # in a batch being written

    @property
    def finished(self) -> bool:
        return self.pk is not None or self.error is not None

    def finish(self, pk: int | None = None, error: BaseException | None = None) -> None:
        if not self.finished:  # the first outcome counts: a late commit after a 503 stays one
            self.pk, self.error = pk, error
        self.woken.set()


class GroupCommit:
    """The per-process queue of rows waiting to be stored (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[_Row] = deque()
        self._writing = False  # a leader is writing; False implies an empty queue
        self._layout: _Layout | None = None
        self._statements: dict[int, str] = {}

    def insert(self, fields: dict[str, Any], *, seconds: float) -> RawEvent:
        """Store one row (RawEvent attnames to values) within `seconds`; once committed, the
        RawEvent it is (built positionally: no per-field defaults, no kwargs).

        Raises DatabaseError (StoreTimeout past the deadline): nothing may be acknowledged.
        """
        values = self._values(fields)
        if connection.in_atomic_block:
            with database_deadline(seconds):
                return RawEvent(self._write_alone(values), *values)  # type: ignore[misc]
        row = _Row(values, time.monotonic() + seconds)
        with self._lock:
            self._queue.append(row)
            row.lead = not self._writing
            self._writing = True
        while not row.finished:
            if row.lead:
                # The row is first in the queue (a new leader finds it empty; the lead is
                # handed to the oldest row), so this batch writes it (or fails it).
                self._lead()
                continue
            if row.woken.wait(max(0.0, row.deadline - time.monotonic())):
                continue
            with self._lock:
                if row.woken.is_set():
                    continue
                if not row.taken:  # still queued at its deadline: it leaves unwritten
                    self._queue.remove(row)
                    row.finish(error=self._timeout(seconds))
                    continue
            # Its batch is being written under a deadline no later than its own.
            if not row.woken.wait(_HANDBACK_SECONDS):
                row.finish(error=self._timeout(seconds))
        if row.error is not None:
            raise row.error
        return RawEvent(row.pk, *values)  # type: ignore[misc]

    @staticmethod
    def _timeout(seconds: float) -> StoreTimeout:
        return StoreTimeout(f"the row was not committed within the store deadline ({seconds:g} s)")

    # --- the leader --------------------------------------------------------------------------

    def _lead(self) -> None:
        """Write one batch of what is queued, then hand the lead on (or give it up)."""
        now = time.monotonic()
        batch: list[_Row] = []
        with self._lock:
            while self._queue and len(batch) < MAX_ROWS_PER_BATCH:
                row = self._queue.popleft()
                row.lead = False
                if row.deadline <= now:
                    row.finish(error=self._timeout(0))
                    continue
                row.taken = True
                batch.append(row)
        try:
            if batch:
                self._write(batch, min(row.deadline for row in batch) - now)
        finally:
            with self._lock:
                if self._queue:
                    successor = self._queue[0]
                    successor.lead = True
                    successor.woken.set()
                else:
                    self._writing = False

    def _write(self, batch: list[_Row], seconds: float) -> None:
        try:
            with database_deadline(seconds):
                try:
                    pks = self._insert([row.values for row in batch])
                except DatabaseError as exc:
                    if len(batch) == 1 or isinstance(exc, (OperationalError, InterfaceError)):
                        raise
                    # A row the database refused on its own: write each alone, so it alone fails.
                    for row in batch:
                        try:
                            row.finish(pk=self._write_alone(row.values))
                        except DatabaseError as row_error:
                            row.finish(error=row_error)
                    return
        except BaseException as exc:
            for row in batch:
                row.finish(error=exc)
            if not isinstance(exc, Exception):
                raise
            return
        for row, pk in zip(batch, pks, strict=True):
            row.finish(pk=pk)

    def _write_alone(self, values: list[Any]) -> int:
        (pk,) = self._insert([values])
        return pk

    def _insert(self, rows: Sequence[list[Any]]) -> list[int]:
        try:
            return self._execute(rows)
        except (OperationalError, InterfaceError):
            if not _connection_lost():
                raise
            # The server hung up on this persistent connection (a restart the idle-socket
            # check did not see yet, a reset on send): reconnect once and INSERT again, inside
            # the same deadline. If the first INSERT did reach the server and commit before the
            # connection died, its events are stored twice; the inbox's dedup key makes each
            # copy a `duplicate`, so every provider's event is still handled once.
            connection.close()
            return self._execute(rows)

    def _execute(self, rows: Sequence[list[Any]]) -> list[int]:
        params = [value for values in rows for value in self._prepared(values)]
        with _server_bound_cursor() as cursor:
            cursor.execute(self._statement(len(rows)), params)
            return sorted(pk for (pk,) in cursor.fetchall())

    # --- the statement -----------------------------------------------------------------------

    def _values(self, fields: dict[str, Any]) -> list[Any]:
        layout = self._columns()
        values = layout.constants.copy()
        for name, value in fields.items():
            position = layout.index.get(name)
            if position is None:
                raise TypeError(f"RawEvent has no column {name!r}")
            values[position] = value
        for name, (position, factory) in layout.factories.items():
            if name not in fields:
                values[position] = factory()
        return values

    def _prepared(self, values: list[Any]) -> list[Any]:
        preparers = self._columns().preparers
        return [prepare(value) for prepare, value in zip(preparers, values, strict=True)]

    def _columns(self) -> _Layout:
        if self._layout is None:  # on first use: the model is ready by then
            self._layout = _Layout.of_raw_event()
        return self._layout

    def _statement(self, rows: int) -> str:
        statement = self._statements.get(rows)
        if statement is None:
            columns = self._columns().columns
            quote = connection.ops.quote_name
            one = "(" + ", ".join(["%s"] * len(columns)) + ")"
            statement = (
                f"INSERT INTO {quote(RawEvent._meta.db_table)} "  # noqa: S608 (names, no input)
                f"({', '.join(quote(column) for column in columns)}) "
                f"VALUES {', '.join([one] * rows)} RETURNING {quote(RawEvent._meta.pk.column)}"
            )
            self._statements[rows] = statement
        return statement


def _server_bound_cursor():
    """A cursor of this thread's connection that sends the values apart from the statement.

    Django's own psycopg cursor binds on the client: it renders every value into the SQL text
    in Python (the body as an escaped bytea literal, twice its size) and the server parses it
    all again. Measured on a batch of 8 rows that was most of the statement's cost. This one
    sends the values as parameters (the body as raw bytes); it is still wrapped the way Django
    wraps its own cursors (error translation, execute wrappers, query capture in tests).
    """
    if connection.vendor != "postgresql":
        return connection.cursor()
    from django.db.backends.postgresql.base import (  # type: ignore[attr-defined]
        ServerBindingCursor,
    )

    connection.ensure_connection()
    with connection.wrap_database_errors:
        return connection._prepare_cursor(  # type: ignore[attr-defined]
            ServerBindingCursor(connection.connection)
        )


def _connection_lost() -> bool:
    """psycopg saw the connection break (not a timeout of ours, not a refused connect)."""
    # Inside a transaction a new connection would silently lose the statements before this
    # one. SQLite connections never break this way.
    broken = getattr(connection.connection, "broken", False)
    return broken and not connection.in_atomic_block


# One per process: the rows of every server thread of this process.
raw_rows = GroupCommit()
