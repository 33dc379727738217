"""The webhook's one durable write on the production server's event loop: group commit.

The rows of a web process's requests that wait to be stored at the same moment are written
as one INSERT, committed once (autocommit: the statement is its own transaction), on one of
the process's asyncio connections (psycopg's public async API, opened by
kernel.db.postgresql's `open_async_connection`: the parameters, role and client-side
bounds of the process's own Django connection); each request is answered once that commit
returns, with its own row's id. One INSERT and one commit per request cost the web process
more than everything else a webhook does, most of it the round trip itself
(docs/benchmarks.md), and PostgreSQL a commit each.

How a batch forms, without a timer: a request queues its row and, while fewer than
`max_connections` writers run, starts one. A writer takes everything queued (at most
MAX_ROWS_PER_BATCH), writes it, and goes on while rows are queued. So a lone request is
written at once, and under load a batch is whatever arrived during the previous commit.

Every wait of a request is bounded by its own store deadline (at most
WEBHOOK_STORE_TIMEOUT_SECONDS, less when its source's budget leaves less: ingress/asgi.py): a
batch is written under the earliest deadline of its rows (kernel.db's `database_deadline`:
the INSERT and one reconnect after a connection the server dropped, both inside it), and a
request whose deadline passes first fails (StoreTimeout); its row leaves the queue, body and
all, and is never written. A writer without a connection opens one before it takes a batch,
within WEBHOOK_STORE_TIMEOUT_SECONDS of its own (`connect_seconds`), while the rows wait in the
queue on their own deadlines: a source with a short budget (Slack's 3 s) never leaves a writer
too little time to connect. A failed batch fails every request in it (each answers 503 and
its provider retries); a batch the database refuses for a value (not for being unavailable)
is written again row by row, so one bad row fails alone. Errors are Django's (DatabaseError
and its subclasses), as from the ORM.

Memory: a row holds its body by reference, from the request's buffer to the INSERT's
parameters (psycopg dumps a batch's bodies into one array parameter, which libpq copies into
its send buffer: two copies, for the time of the INSERT).

Row ids: the rows of one INSERT … SELECT FROM unnest(…) are inserted, and take their ids from
the sequence, in the order of the arrays, so the ids sorted ascending are the rows in order.
"""

import asyncio
import contextlib
import select
import time
from collections import deque
from functools import cache
from typing import Any

import psycopg
from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.models import Field
from psycopg.types.json import Jsonb

from ingress.models import RawEvent
from kernel.db import database_deadline
from kernel.db.postgresql.base import BoundedAsyncConnection, open_async_connection
from kernel.tracing import untraced_context

# A bound on one statement's size (its arrays), far above a batch at any rate measured.
MAX_ROWS_PER_BATCH = 64


class StoreTimeout(OperationalError):
    """The row was not committed within the request's store deadline (it may be later)."""


class _Row:
    __slots__ = ("abandoned", "deadline", "names", "outcome", "values")

    def __init__(self, fields: dict[str, Any], deadline: float, outcome: asyncio.Future):
        self.names = tuple(fields)  # the columns it sets: one statement per set of them
        self.values = list(fields.values())
        self.deadline = deadline
        # (id, None) or (None, error): set by the writer, never raised into the future, so
        # an outcome nobody waits for any more is not an unretrieved exception.
        self.outcome = outcome
        self.abandoned = False  # its request stopped waiting: not to be written


class RawEventWriter:
    """A web process's queue of rows and its asyncio connections (see the module docstring)."""

    def __init__(
        self, *, max_connections: int, connect_seconds: float, alias: str = "default"
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.alias = alias
        self.max_connections = max_connections
        self.connect_seconds = connect_seconds
        self._queue: deque[_Row] = deque()
        self._writers: set[asyncio.Task] = set()
        self._idle: list[BoundedAsyncConnection] = []
        # Django keeps a DatabaseWrapper per asyncio context: looked up per batch, each
        # writer would build one. It only translates psycopg's errors here.
        self._errors = connections[alias].wrap_database_errors

    async def insert(self, fields: dict[str, Any], *, seconds: float) -> int:
        """Store one row (RawEvent attnames to values) within `seconds`; its id once
        committed. Raises DatabaseError (StoreTimeout past the deadline): nothing may be
        acknowledged."""
        loop = asyncio.get_running_loop()
        row = _Row(fields, time.monotonic() + seconds, loop.create_future())
        self._queue.append(row)
        if len(self._writers) < self.max_connections:
            # A context of its own: a batch writes the rows of many requests, so none of their
            # spans is its parent, and its queries make no span at all.
            writer = loop.create_task(self._write_queued(), context=untraced_context())
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)
        try:
            async with asyncio.timeout(seconds):
                pk, error = await asyncio.shield(row.outcome)
        except TimeoutError:
            row.abandoned = True
            with contextlib.suppress(ValueError):
                self._queue.remove(row)  # still queued: its body goes now, not at a writer's turn
            raise StoreTimeout(
                f"the row was not committed within the store deadline ({seconds:g} s)"
            ) from None
        if error is not None:
            raise error
        return pk

    async def aclose(self) -> None:
        """Close the idle connections (the server's shutdown)."""
        idle, self._idle = self._idle, []
        for held in idle:
            await held.close()

    async def _write_queued(self) -> None:
        held = None
        try:
            while self._queue:
                if held is None:
                    held = await self._connect_or_fail_a_batch()
                    continue
                batch = self._take_batch()
                if batch:
                    held = await self._write(batch, held)
        finally:
            # Leaves the set in the step that found the queue empty, not in the done callback
            # a loop iteration later: a row queued in between would find the writers full and
            # start none.
            self._writers.discard(asyncio.current_task())  # type: ignore[arg-type]
            if held is not None and not held.closed:
                self._idle.append(held)

    def _take_batch(self) -> list[_Row]:
        """The rows at the head of the queue that one statement writes, whose requests still
        wait for them."""
        now = time.monotonic()
        batch: list[_Row] = []
        while self._queue and len(batch) < MAX_ROWS_PER_BATCH:
            if batch and self._queue[0].names != batch[0].names:
                break  # another statement: the next batch
            row = self._queue.popleft()
            if not row.abandoned and row.deadline > now:
                batch.append(row)
        return batch

    async def _connect_or_fail_a_batch(self) -> BoundedAsyncConnection | None:
        """A connection for this writer, within `connect_seconds`; if none can be had, the
        batch it would have written fails with the reason (its requests answer 503 at once)."""
        try:
            with database_deadline(self.connect_seconds):
                return await self._connection()
        except BaseException as error:
            for row in self._take_batch():
                _finish(row, error=error)
            if not isinstance(error, Exception):
                raise
            return None

    async def _write(
        self, batch: list[_Row], held: BoundedAsyncConnection
    ) -> BoundedAsyncConnection | None:
        """Write one batch and answer its rows; the connection to keep, or None."""
        try:
            with database_deadline(min(row.deadline for row in batch) - time.monotonic()):
                try:
                    held, pks = await self._insert(held, batch)
                except (OperationalError, InterfaceError):
                    raise
                except DatabaseError:
                    if len(batch) == 1:
                        raise
                    # A value the database refused: each row alone, so that row alone fails.
                    for row in batch:
                        try:
                            held, (pk,) = await self._insert(held, [row])
                            _finish(row, pk=pk)
                        except DatabaseError as error:
                            _finish(row, error=error)
                    return held
        except BaseException as error:
            for row in batch:
                _finish(row, error=error)
            if not isinstance(error, Exception):
                raise
            return None if held.closed else held
        for row, pk in zip(batch, pks, strict=True):
            _finish(row, pk=pk)
        return held

    async def _insert(
        self, held: BoundedAsyncConnection, batch: list[_Row]
    ) -> tuple[BoundedAsyncConnection, list[int]]:
        """The batch's INSERT on `held`, once more on a new connection if the server dropped
        `held` under it (a restart the idle check did not see yet). If the first one did
        commit before the connection died, its events are stored twice; the inbox's dedup
        key makes each copy a `duplicate`."""
        statement, constants = _statement(batch[0].names, "%b")
        params = _parameters(constants, [row.values for row in batch])
        with self._errors:
            try:
                cursor = await held.execute(statement, params)
            except (psycopg.OperationalError, psycopg.InterfaceError):
                if not held.broken:
                    raise  # our own bound (it closed the connection), or refused
                await held.close()
                held = await open_async_connection(self.alias)
                cursor = await held.execute(statement, params)
            return held, sorted(pk for (pk,) in await cursor.fetchall())

    async def _connection(self) -> BoundedAsyncConnection:
        """An idle connection that still looks alive, or a new one (within the deadline)."""
        while self._idle:
            held = self._idle.pop()
            if not held.closed and not held.broken and not _hung_up(held.fileno()):
                return held
            await held.close()
        with self._errors:
            return await open_async_connection(self.alias)


def _finish(row: _Row, *, pk: int | None = None, error: BaseException | None = None) -> None:
    if not row.outcome.done():
        row.outcome.set_result((pk, error))


def _hung_up(fileno: int) -> bool:
    """An idle connection's socket is readable only when the server hung up (as Django's
    is_usable() in kernel.db.postgresql)."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN)
    return bool(poller.poll(0))


def raw_event_insert(fields: dict[str, Any]) -> RawEvent:
    """One row by the group commit's statement, on this thread's Django connection (the WSGI
    view, commands, tests): a webhook row is written one way. Its caller bounds the time."""
    names = tuple(fields)
    # %s: a client-side binding connection (behind PgBouncer) cannot send binary parameters.
    statement, constants = _statement(names, "%s")
    with connections["default"].cursor() as cursor:
        cursor.execute(statement, _parameters(constants, [list(fields.values())]))
        (pk,) = cursor.fetchone()
    row = {field.attname: field.get_default() for field in constants}
    row.update(fields, **{RawEvent._meta.pk.attname: pk})
    columns = [field.attname for field in RawEvent._meta.concrete_fields]  # from_db's order
    return RawEvent.from_db("default", columns, [row[name] for name in columns])


def _parameters(constants: tuple[Field, ...], rows: list[list[Any]]) -> list[Any]:
    """The statement's parameters: the defaults it sends once, then one array per column."""
    params = [field.get_default() for field in constants]
    params += [[row[i] for row in rows] for i in range(len(rows[0]))]
    return [_json(value) for value in params]


def _json(value: Any) -> Any:
    """A dict is the JSON column's value (the headers): psycopg sends it as jsonb."""
    if isinstance(value, list):
        return [_json(item) for item in value]
    return Jsonb(value) if isinstance(value, dict) else value


@cache
def _statement(names: tuple[str, ...], placeholder: str) -> tuple[str, tuple[Field, ...]]:
    """The INSERT of a batch of rows that set the columns `names` (attnames), and the fields
    whose model default it is sent once for the whole batch.

    A column the rows set is one array parameter (its values, in the rows' order); any
    other column is its model default, one parameter for the batch. The group commit sends
    every parameter in binary (`%b`): psycopg dumps a list of bodies as raw bytes, where the
    text form would escape every byte in Python. The statement is the same whatever the
    batch's size.
    """
    connection = connections["default"]
    quote = connection.ops.quote_name
    fields = [field for field in RawEvent._meta.concrete_fields if not field.primary_key]
    by_name = {field.attname: field for field in fields}
    unknown = set(names) - set(by_name)
    if unknown:
        raise TypeError(f"RawEvent has no column {sorted(unknown)}")
    selected = [
        f"r.{quote(field.column)}"
        if field.attname in names
        else f"{placeholder}::{field.db_type(connection)}"
        for field in fields
    ]
    arrays = ", ".join(f"{placeholder}::{by_name[name].db_type(connection)}[]" for name in names)
    aliases = ", ".join(quote(by_name[name].column) for name in names)
    return (
        f"INSERT INTO {quote(RawEvent._meta.db_table)} "  # noqa: S608 (model names and types)
        f"({', '.join(quote(field.column) for field in fields)}) "
        f"SELECT {', '.join(selected)} FROM unnest({arrays}) AS r({aliases}) "
        f"RETURNING {quote(RawEvent._meta.pk.column)}",
        tuple(field for field in fields if field.attname not in names),
    )
