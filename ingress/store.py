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

import asyncio
import json
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, connections

from eventdrop.db import database_deadline
from eventdrop.db.json_rows import ENCODER as JSON_ENCODER
from eventdrop.db.postgresql.base import open_async_connection
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
    inlinable: list[int]  # constant defaults that can be written into the statement

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
        inlinable = [
            position
            for position, constant in enumerate(constants)
            if names[position] not in factories and _inlinable(constant)
        ]
        return cls(names, columns, preparers, constants, factories, index, inlinable)


def _adapted_by(model_field) -> Callable[[Any], Any]:
    return lambda value: model_field.get_db_prep_save(value, connection=connection)


def _as_is(value: Any) -> Any:
    return value


class _QueuedValues:
    """A row waiting for a group commit: its values, deadline and first outcome. How the
    waiting request is woken is the subclass's (a thread's Event, the loop's Future)."""

    __slots__ = ("deadline", "error", "pk", "taken", "values")

    def __init__(self, values: list[Any], deadline: float):
        self.values = values
        self.deadline = deadline
        self.pk: int | None = None
        self.error: BaseException | None = None
        self.taken = False  # in a batch being written

    @property
    def finished(self) -> bool:
        return self.pk is not None or self.error is not None

    def finish(self, pk: int | None = None, error: BaseException | None = None) -> None:
        if not self.finished:  # the first outcome counts: a late commit after a 503 stays one
            self.pk, self.error = pk, error
        self._wake()

    def _wake(self) -> None:
        raise NotImplementedError


class _Row(_QueuedValues):
    __slots__ = ("lead", "woken")

    def __init__(self, values: list[Any], deadline: float):
        super().__init__(values, deadline)
        self.woken = threading.Event()  # finished, or handed the lead
        self.lead = False  # handed the lead: write what is queued

    def _wake(self) -> None:
        self.woken.set()


class _RawEventRows:
    """What both group commits share: a RawEvent row as a list of values, and the statement
    that inserts a batch of them."""

    def __init__(self) -> None:
        self._layout: _Layout | None = None
        self._statements: dict[tuple[Any, tuple[int, ...]], str] = {}

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

    def _batch(self, rows: Sequence[list[Any]]) -> tuple[str, list[Any]]:
        """The INSERT of `rows` and its parameters.

        A column every row of the batch leaves at its constant default (17 of the 29 on the
        receive path: the verdict, dispatch and retry columns a new row starts with) is
        written into the statement as that constant instead of a parameter per row: what a
        batch costs in Python is mostly psycopg adapting parameters one by one.
        """
        layout = self._columns()
        inlined = self._inlined(rows)
        key = (len(rows), inlined)
        statement = self._statements.get(key)
        if statement is None:
            statement = self._statements[key] = self._render(len(rows), set(inlined))
        if inlined:
            preparers = [
                (position, prepare)
                for position, prepare in enumerate(layout.preparers)
                if position not in inlined
            ]
            params = [
                prepare(values[position]) for values in rows for position, prepare in preparers
            ]
        else:
            params = [value for values in rows for value in self._prepared(values)]
        return statement, params

    def _inlined(self, rows: Sequence[list[Any]]) -> tuple[int, ...]:
        """The inlinable columns every row leaves at its default (the one object the layout
        holds: `is`, not `==`, so a value a caller set is never mistaken for it)."""
        constants = self._columns().constants
        inlined = [p for p in self._columns().inlinable if rows[0][p] is constants[p]]
        for values in rows[1:]:
            kept = [p for p in inlined if values[p] is constants[p]]
            if len(kept) != len(inlined):
                inlined = kept
        return tuple(inlined)

    def _render(self, rows: int, inlined: set[int]) -> str:
        layout = self._columns()
        quote = connection.ops.quote_name
        one = (
            "("
            + ", ".join(
                _literal(layout.constants[position]) if position in inlined else "%s"
                for position in range(len(layout.columns))
            )
            + ")"
        )
        return (
            f"INSERT INTO {quote(RawEvent._meta.db_table)} "  # noqa: S608 (names and constants)
            f"({', '.join(quote(column) for column in layout.columns)}) "
            f"VALUES {', '.join([one] * rows)} RETURNING {quote(RawEvent._meta.pk.column)}"
        )


def _literal(constant: Any) -> str:
    """A model default as SQL (only those _Layout marks inlinable: no quote or backslash)."""
    if constant is None:
        return "NULL"
    if isinstance(constant, bool):
        return "TRUE" if constant else "FALSE"
    if isinstance(constant, int):
        return str(constant)
    return f"'{constant}'"


def _inlinable(constant: Any) -> bool:
    if constant is None or isinstance(constant, (bool, int)):
        return True
    return isinstance(constant, str) and not any(char in constant for char in "'\\\x00%")


class GroupCommit(_RawEventRows):
    """The per-process queue of rows waiting to be stored (see the module docstring), for
    server threads: each writes on its own thread's Django connection."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._queue: deque[_Row] = deque()
        self._writing = False  # a leader is writing; False implies an empty queue

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
        with _server_bound_cursor() as cursor:
            cursor.execute(*self._batch(rows))
            return sorted(pk for (pk,) in cursor.fetchall())


class _QueuedRow(_QueuedValues):
    """A row waiting on the event loop: its outcome, and a future that wakes its request."""

    __slots__ = ("woken",)

    def __init__(self, values: list[Any], deadline: float, woken: asyncio.Future):
        super().__init__(values, deadline)
        self.woken = woken

    def _wake(self) -> None:
        _resolve(self.woken)  # done already when its request timed out and cancelled it


class LoopGroupCommit(_RawEventRows):
    """Group commit on the web server's event loop: the receive path without threads.

    The production server runs `/webhooks/` as an async view on uvicorn's event loop
    (eventdrop/web.py), and its rows are written here on asyncio psycopg connections
    (eventdrop.db.postgresql's `open_async_connection`: the same parameters, role and bounds
    as the process's own Django connection). Requests queue their row and await it; up to
    `max_connections` writer tasks each take everything queued (at most MAX_ROWS_PER_BATCH),
    write it as one INSERT, committed once, and answer each row with its id. While one batch
    commits the next one gathers, so a lone request is written at once and under load a batch
    is whatever arrived during a commit, as with the threads' GroupCommit. No thread hop, no
    lock, no wake-up of another thread per request: that per-request cost was most of what
    the thread path spent (docs/benchmarks.md).

    Gathering (`gather_seconds`, WEBHOOK_STORE_GATHER_SECONDS): before it writes, a writer
    waits until as many rows are queued as its store's last batch held, but no longer than
    that. Without it, clients that keep a few requests each in flight split into groups whose
    rows arrive while the other group's batch commits, and batches stay small (~4 rows at 16
    connections over two processes); the ones just answered come back within a millisecond,
    so waiting for them makes one batch of all (~9 rows): less CPU per webhook in Python and
    in PostgreSQL, and a higher ACK rate (docs/benchmarks.md, "Gathering"). A lone request
    waits for nothing (the last batch held one row: it is there); when the load falls, one
    batch waits the whole `gather_seconds` and the next expects only what came. It is
    PostgreSQL's own commit_delay, keyed on the rows expected rather than on siblings.

    The same promises as GroupCommit: every wait inside the request's store deadline (a
    batch is written under the earliest deadline of its rows, connecting included, with one
    reconnect on a lost connection); a row still queued at its deadline leaves unwritten;
    a row the database refuses alone fails alone; any other failure fails the batch (503s).
    Errors are Django's (`DatabaseError` and its subclasses), as from the ORM.

    Used only on the loop it serves (`serve()`); any other caller (a sync view under WSGI,
    the test client's per-request loop) stores through the threads' GroupCommit.
    """

    def __init__(self, *, alias: str = "default") -> None:
        super().__init__()
        self.alias = alias
        self.max_connections = 1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: deque[_QueuedRow] = deque()
        self._idle: list[Any] = []  # open connections no writer holds
        self._writers: set[asyncio.Task] = set()
        self._wrapper: Any = None  # the alias's DatabaseWrapper, bound by serve()
        self.gather_seconds = 0.0  # bound by serve()
        self._last_batch = 0  # rows in the batch written last: as many are expected next
        # Writers gathering: how many rows each waits for, and the future that wakes it.
        self._gathering: list[tuple[int, asyncio.Future]] = []

    def serve(self, loop: asyncio.AbstractEventLoop, *, max_connections: int) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if loop is not self._loop:
            # Connections of another loop (a test's, run and gone) cannot be awaited here.
            for held in self._idle:
                held.pgconn.finish()
            self._idle.clear()
            self._writers.clear()  # tasks of that loop: they will never write here
        self._loop, self.max_connections = loop, max_connections
        self.gather_seconds = settings.WEBHOOK_STORE_GATHER_SECONDS
        # Django keeps a DatabaseWrapper per asyncio context: looked up per batch, each
        # request's task would build one of its own. It only translates errors here.
        self._wrapper = connections[self.alias]

    async def aclose(self) -> None:
        """Close the idle connections (the server's shutdown; the writers hold none then)."""
        idle, self._idle = self._idle, []
        for held in idle:
            await held.close()

    def serves(self, loop: asyncio.AbstractEventLoop) -> bool:
        return loop is self._loop

    async def insert(self, fields: dict[str, Any], *, seconds: float) -> int:
        """Store one row within `seconds` (as GroupCommit.insert), awaiting its commit; its id
        (the receive view answers with nothing else, so no model instance is built).

        Raises DatabaseError (StoreTimeout past the deadline): nothing may be acknowledged.
        """
        values = self._values(fields)
        loop = asyncio.get_running_loop()
        row = _QueuedRow(values, time.monotonic() + seconds, loop.create_future())
        self._queue.append(row)
        if self._gathering:
            self._wake_gathered()
        if len(self._writers) < self.max_connections:
            writer = loop.create_task(self._write_queued())
            self._writers.add(writer)
            # Also when it ends without running (cancelled before its first step, as a loop
            # that closes cancels it), where its own `finally` below never runs.
            writer.add_done_callback(self._writers.discard)
        await self._outcome(row, seconds)
        if row.error is not None:
            raise row.error
        assert row.pk is not None  # finished, without an error
        return row.pk

    async def _outcome(self, row: _QueuedRow, seconds: float) -> None:
        # A timer that resolves the row's future at its deadline, rather than an
        # asyncio.timeout() around the await: the same wake-up without a cancellation to
        # raise, catch and uncancel, once per webhook (docs/benchmarks.md, "One ASGI layer").
        expiry = asyncio.get_running_loop().call_later(
            max(0.0, row.deadline - time.monotonic()), row._wake
        )
        try:
            await row.woken
        finally:
            expiry.cancel()
        if row.finished:
            return
        if not row.taken:  # still queued at its deadline: it leaves unwritten
            self._queue.remove(row)
            row.finish(error=GroupCommit._timeout(seconds))
            return
        # Its batch is being written under a deadline no later than its own.
        row.woken = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(_HANDBACK_SECONDS):
                await row.woken
        except TimeoutError:
            row.finish(error=GroupCommit._timeout(seconds))

    # --- the writers -------------------------------------------------------------------------

    async def _write_queued(self) -> None:
        held = None
        try:
            while self._queue:
                await self._gather()
                batch = self._take_batch()
                if batch:
                    self._last_batch = len(batch)
                    held = await self._write(batch, held)
        finally:
            # Leaves the set in the same step that found the queue empty, not in a done
            # callback a loop iteration later: a row queued in between would see a writer
            # still counted, start none, and wait out its whole deadline (seen: 503s after 5 s
            # when every client's next request came before the callback).
            self._writers.discard(asyncio.current_task())  # type: ignore[arg-type]
            if held is not None and not held.closed:
                self._idle.append(held)

    async def _gather(self) -> None:
        """Wait until as many rows are queued as the last batch held: gather_seconds at most,
        and never more than half of what the earliest queued row has left of its deadline."""
        expected = min(self._last_batch, MAX_ROWS_PER_BATCH)
        if len(self._queue) >= expected or not self.gather_seconds:
            return
        now = time.monotonic()
        earliest = min(row.deadline for row in self._queue)
        wait = min(self.gather_seconds, (earliest - now) / 2)
        if wait <= 0:
            return
        loop = asyncio.get_running_loop()
        gathered = loop.create_future()
        waiting = (expected, gathered)
        self._gathering.append(waiting)
        timer = loop.call_later(wait, _resolve, gathered)
        try:
            await gathered
        finally:
            timer.cancel()
            self._gathering.remove(waiting)

    def _wake_gathered(self) -> None:
        queued = len(self._queue)
        for expected, gathered in self._gathering:
            if queued >= expected:
                _resolve(gathered)

    def _take_batch(self) -> list[_QueuedRow]:
        now = time.monotonic()
        batch: list[_QueuedRow] = []
        while self._queue and len(batch) < MAX_ROWS_PER_BATCH:
            row = self._queue.popleft()
            if row.deadline <= now:
                row.finish(error=GroupCommit._timeout(0))
                continue
            row.taken = True
            batch.append(row)
        return batch

    async def _write(self, batch: list[_QueuedRow], held):
        """Write one batch (on `held`, or a connection taken or opened for it) and answer its
        rows; the connection to keep for the next batch, or None."""
        wrapper = self._wrapper
        try:
            with database_deadline(min(row.deadline for row in batch) - time.monotonic()):
                with wrapper.wrap_database_errors:
                    held = held or await self._connection()
                    try:
                        held, pks = await self._insert(held, [row.values for row in batch])
                    except psycopg.Error as exc:
                        if len(batch) == 1 or isinstance(
                            exc, (psycopg.OperationalError, psycopg.InterfaceError)
                        ):
                            raise
                        pks = None
                if pks is None:
                    # A row the database refused on its own: write each alone, so it alone fails.
                    for row in batch:
                        try:
                            with wrapper.wrap_database_errors:
                                held, (pk,) = await self._insert(held, [row.values])
                            row.finish(pk=pk)
                        except DatabaseError as row_error:
                            row.finish(error=row_error)
                    return held
        except BaseException as exc:
            for row in batch:
                row.finish(error=exc)
            if not isinstance(exc, Exception):
                raise
            return None if held is None or held.closed else held
        for row, pk in zip(batch, pks, strict=True):
            row.finish(pk=pk)
        return held

    async def _insert(self, held, rows: Sequence[list[Any]]):
        try:
            return held, await self._execute(held, rows)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            if not held.broken:
                raise  # our own bound (the connection was closed, not lost), or refused
            # Lost (a restart the idle check did not see yet, a reset on send): reconnect once
            # and INSERT again, inside the same deadline; a copy that did commit is a
            # `duplicate` for the inbox, as in GroupCommit._insert.
            await held.close()
            held = await open_async_connection(self.alias)
            return held, await self._execute(held, rows)

    async def _execute(self, held, rows: Sequence[list[Any]]) -> list[int]:
        cursor = await held.execute(*self._json_batch(rows))
        return sorted(pk for (pk,) in await cursor.fetchall())

    def _json_batch(self, rows: Sequence[list[Any]]) -> tuple[str, list[Any]]:
        """The batch as one JSON parameter that PostgreSQL turns into rows of the table.

        `json_populate_recordset(NULL::ingress_rawevent, …)` gives each value the column's
        own type by the column's own input function, as a parameter of that type would be:
        the body as bytea's hex form (exact bytes), the timestamp in ISO 8601 with its
        offset, the headers as a JSON object for the jsonb column. A value a column refuses
        fails the statement as the VALUES form does. Measured (docs/benchmarks.md): psycopg
        adapting 12 parameters a row, one by one in Python, cost more than everything else a
        webhook does in Python; the document is built by the C JSON encoder, a row at a time,
        with the bytes spliced in. The statement text never changes (psycopg converts it
        once; per batch size it would parse it again).
        """
        layout = self._columns()
        inlined = self._inlined(rows)
        key = ("json", inlined)
        statement = self._statements.get(key)
        if statement is None:
            quote = connection.ops.quote_name
            table = quote(RawEvent._meta.db_table)
            selected = ", ".join(
                _literal(layout.constants[position])
                if position in inlined
                else f"r.{quote(column)}"
                for position, column in enumerate(layout.columns)
            )
            statement = self._statements[key] = (
                f"INSERT INTO {table} "  # noqa: S608 (names and constants)
                f"({', '.join(quote(column) for column in layout.columns)}) "
                f"SELECT {selected} FROM json_populate_recordset(NULL::{table}, %s::json) AS r "
                f"RETURNING {quote(RawEvent._meta.pk.column)}"
            )
        columns = layout.columns
        sent = [position for position in range(len(columns)) if position not in inlined]
        rows_text = []
        for values in rows:
            # Bytes are spliced in as bytea's hex text, not handed to json.dumps: hex digits
            # need no JSON escaping, and json.dumps scanning the ~3 KiB string of every body
            # for characters to escape was a tenth of the web worker's time
            # (docs/benchmarks.md, "The webhook chain").
            plain = {}
            spliced = []
            for position in sent:
                value = values[position]
                if isinstance(value, (bytes, bytearray, memoryview)):
                    hex_text = bytes(value).hex()
                    spliced.append(f'{_JSON_KEYS[columns[position]]}:"\\\\x{hex_text}"')
                else:
                    plain[columns[position]] = value
            text = JSON_ENCODER.encode(plain)
            if spliced:
                text = f"{text[:-1]}{',' if plain else ''}{','.join(spliced)}}}"
            rows_text.append(text)
        document = f"[{','.join(rows_text)}]"
        return statement, [document]

    async def _connection(self):
        """An idle connection that still looks alive, or a new one (within the deadline)."""
        while self._idle:
            held = self._idle.pop()
            if not held.closed and not held.broken and not _hung_up(held.fileno()):
                return held
            await held.close()
        return await open_async_connection(self.alias)


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


# A column's name as a JSON object key (quoted once, not per row).
_JSON_KEYS = {field.column: json.dumps(field.column) for field in RawEvent._meta.concrete_fields}


def _hung_up(fileno: int) -> bool:
    """An idle connection's socket is readable only when the server hung up (as is_usable())."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN)
    return bool(poller.poll(0))


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
# One per web process: the rows of the async receive view on the server's event loop.
raw_rows_on_loop = LoopGroupCommit()
