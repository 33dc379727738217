"""The receive path's group commit on the event loop (ingress/store.py, LoopGroupCommit),
against the real PostgreSQL: what it stores, how rows share statements, and how it fails."""

import asyncio
import hashlib
import time
from datetime import UTC, datetime

import pytest
from django.db import DatabaseError, DataError, OperationalError

from eventdrop.db.postgresql.base import open_async_connection
from ingress.models import RawEvent
from ingress.store import LoopGroupCommit, StoreTimeout

pytestmark = pytest.mark.django_db(transaction=True)


def _fields(number: int, **overrides) -> dict:
    body = b'{"id": "evt_%d", "bytes": "\x00\xff\r\n"}' % number
    fields = {
        "source": "stripe",
        "provider": "stripe",
        "method": "POST",
        "path": "/webhooks/stripe/",
        "query_string": f"n={number}&q='quoted'",
        "headers": {"stripe-signature": f"t=1,v1={number:064x}", "x-odd": "caf\u00e9 \\ \" '"},
        "body": body,
        "body_encryption": "",
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "remote_addr": "2001:db8::1" if number % 2 else "127.0.0.1",
        "delivery_id": f"dlv_{number}",
        "received_at": datetime(2026, 12, 1, 12, 0, 0, number, tzinfo=UTC),
    }
    return {**fields, **overrides}


class CountingStore(LoopGroupCommit):
    """Counts the INSERT statements the writer sends."""

    def __init__(self) -> None:
        super().__init__()
        self.statements = 0
        self.batches: list[int] = []  # rows per statement, in order

    async def _execute(self, held, rows):
        self.statements += 1
        self.batches.append(len(rows))
        return await super()._execute(held, rows)


def _run(store: LoopGroupCommit, body, *, connections: int = 1):
    async def main():
        store.serve(asyncio.get_running_loop(), max_connections=connections)
        try:
            return await body(store)
        finally:
            await store.aclose()

    return asyncio.run(main())


def test_concurrent_rows_share_statements_and_each_gets_its_own_id():
    store = CountingStore()

    async def body(store):
        # The first row is written at once, alone; the 39 that queue meanwhile share batches.
        return await asyncio.gather(
            *(store.insert(_fields(n), seconds=5) for n in range(40))
        )

    ids = _run(store, body)

    assert len(set(ids)) == 40
    assert store.statements < 40 / 4  # group commit: batches, not a statement per row
    stored = RawEvent.objects.in_bulk(ids)
    for number, pk in enumerate(ids):
        row, sent = stored[pk], _fields(number)
        # Each id is its own row: exact bytes, headers, time to the microsecond, address.
        assert bytes(row.body) == sent["body"]
        assert row.headers == sent["headers"]
        assert row.received_at == sent["received_at"]
        assert row.remote_addr == sent["remote_addr"]
        assert (row.query_string, row.delivery_id) == (sent["query_string"], sent["delivery_id"])
        # The columns left at their defaults were written as the model's defaults.
        assert (row.signature_status, row.dispatch_status, row.origin) == (
            "pending",
            "waiting",
            "received",
        )
        assert (row.verify_count, row.processing_failures, row.verified_at) == (0, 0, None)


def test_every_byte_value_and_an_empty_body_are_stored_exactly_in_one_batch():
    # The bodies travel spliced into the batch's JSON document as bytea hex text
    # (LoopGroupCommit._json_batch): each of the 256 byte values, at either end of a body,
    # and an empty body, must come back as sent, next to the JSON-encoded columns.
    store = CountingStore()
    bodies = [bytes(range(256)) * 4, bytes(range(255, -1, -1)), b"", b"\\x00", b'"\\"}]']

    async def body(store):
        return await asyncio.gather(
            *(store.insert(_fields(n, body=sent), seconds=5) for n, sent in enumerate(bodies))
        )

    ids = _run(store, body)

    stored = RawEvent.objects.in_bulk(ids)
    assert [bytes(stored[pk].body) for pk in ids] == bodies
    assert [stored[pk].query_string for pk in ids] == [_fields(n)["query_string"] for n in range(5)]
    assert store.statements == 1  # all five in one statement


def test_a_row_queued_as_the_writer_finishes_is_written_at_once():
    # Clients on keep-alive connections send their next webhook as soon as the last one is
    # answered: 16 of them, each queueing its next row in the same loop step that answered
    # its last one. A writer that left the writer set a loop iteration after finding the queue
    # empty (in a done callback) left such rows waiting out their whole store deadline.
    store = LoopGroupCommit()

    async def client(first: int) -> list[int]:
        return [await store.insert(_fields(first + 100 * n), seconds=3) for n in range(25)]

    async def body(store):
        async with asyncio.timeout(20):  # 400 rows; a stall costs 3 s per round of 16
            return await asyncio.gather(*(client(first) for first in range(16)))

    ids = [pk for per_client in _run(store, body) for pk in per_client]

    assert len(set(ids)) == 400
    assert RawEvent.objects.filter(pk__in=ids).count() == 400


def test_a_caller_set_default_column_is_written_not_inlined():
    async def body(store):
        return await asyncio.gather(
            store.insert(_fields(1), seconds=5),
            store.insert(_fields(2, origin="restored"), seconds=5),
        )

    plain, restored = _run(LoopGroupCommit(), body)

    assert RawEvent.objects.get(pk=plain).origin == "received"
    assert RawEvent.objects.get(pk=restored).origin == "restored"


def test_a_row_the_database_refuses_fails_alone():
    async def body(store):
        return await asyncio.gather(
            *(
                store.insert(_fields(n, source="s" * 65 if n == 3 else "stripe"), seconds=5)
                for n in range(6)
            ),
            return_exceptions=True,
        )

    outcomes = _run(LoopGroupCommit(), body)

    # A value too long for varchar(64) is refused, not cut short; the others are stored.
    assert isinstance(outcomes[3], DataError)
    stored = [outcome for outcome in outcomes if isinstance(outcome, int)]
    assert len(stored) == 5
    assert RawEvent.objects.filter(pk__in=stored).count() == 5
    assert not RawEvent.objects.filter(source__startswith="sss").exists()


def test_a_connection_the_server_dropped_is_replaced():
    async def body(store):
        first = await store.insert(_fields(1), seconds=5)
        # Kill the idle connection's backend, as a restart or an idle timeout would.
        (held,) = store._idle
        pid = held.info.backend_pid
        killer = await open_async_connection()
        await killer.execute("SELECT pg_terminate_backend(%s)", [pid])
        await killer.close()
        await asyncio.sleep(0.2)
        second = await store.insert(_fields(2), seconds=5)
        return first, second, pid, store._idle[0].info.backend_pid

    first, second, old_pid, new_pid = _run(LoopGroupCommit(), body)

    assert RawEvent.objects.filter(pk__in=[first, second]).count() == 2
    assert new_pid != old_pid


def test_a_row_still_queued_at_its_deadline_is_never_written(monkeypatch):
    store = LoopGroupCommit()
    release = asyncio.Event

    async def body(store):
        gate = release()
        real_execute = LoopGroupCommit._execute

        async def stuck_first(self, held, rows):
            if not gate.is_set():
                await asyncio.sleep(1.0)  # the first batch's commit takes a second
                gate.set()
            return await real_execute(self, held, rows)

        monkeypatch.setattr(LoopGroupCommit, "_execute", stuck_first)
        first = asyncio.ensure_future(store.insert(_fields(1), seconds=5))
        await asyncio.sleep(0.05)
        # Queued behind the stuck batch with a deadline that ends before it does.
        with pytest.raises(StoreTimeout):
            await store.insert(_fields(2), seconds=0.3)
        return await first

    first = _run(store, body)

    assert list(RawEvent.objects.values_list("pk", flat=True)) == [first]


def test_a_database_that_refuses_connections_fails_fast_with_djangos_error():
    from django.db import connections

    # Nothing listens on port 1: the connect is refused at once, well inside the deadline.
    settings_dict = connections["default"].settings_dict
    port, settings_dict["PORT"] = settings_dict["PORT"], "1"
    try:

        async def body(store):
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(OperationalError) as raised:
                await store.insert(_fields(1), seconds=5)
            return loop.time() - started, raised.value

        elapsed, error = _run(LoopGroupCommit(), body)
    finally:
        settings_dict["PORT"] = port

    assert isinstance(error, DatabaseError)
    assert elapsed < 2


def _timed_insert(store, number: int, *, seconds: float = 5):
    async def insert():
        started = time.monotonic()
        await store.insert(_fields(number), seconds=seconds)
        return time.monotonic() - started

    return insert()


def test_a_writer_gathers_as_many_rows_as_its_last_batch_held(settings):
    # Keep-alive clients come back a moment after their answer: the writer waits for as many
    # rows as it wrote last, and writes them as one batch as soon as they are all there.
    settings.WEBHOOK_STORE_GATHER_SECONDS = 0.5
    store = CountingStore()

    async def body(store):
        await asyncio.gather(*(store.insert(_fields(n), seconds=5) for n in range(4)))

        async def later(number: int, delay: float):
            await asyncio.sleep(delay)
            return await _timed_insert(store, number)

        return await asyncio.gather(*(later(4 + n, 0.02 * n) for n in range(4)))

    waited = _run(store, body)

    assert store.batches == [4, 4]  # not [4, 1, 3]: the first of the four waited for the rest
    assert max(waited) < 0.3  # woken by the fourth row, not by the 0.5 s bound


def test_a_lone_request_waits_for_nothing_and_a_smaller_load_waits_once(settings):
    settings.WEBHOOK_STORE_GATHER_SECONDS = 0.3
    store = CountingStore()

    async def body(store):
        await asyncio.gather(*(store.insert(_fields(n), seconds=5) for n in range(3)))
        # Three expected, one comes: it waits out the bound once, then is written alone...
        after_three = await _timed_insert(store, 3)
        # ...and from then on one is expected: a lone request is written at once.
        alone = [await _timed_insert(store, 4 + n) for n in range(3)]
        return after_three, alone

    after_three, alone = _run(store, body)

    assert store.batches == [3, 1, 1, 1, 1]
    assert 0.25 < after_three < 1.0
    assert max(alone) < 0.2


def test_gathering_never_spends_more_than_half_of_a_rows_store_deadline(settings):
    settings.WEBHOOK_STORE_GATHER_SECONDS = 0.05  # the largest manage.py check allows
    store = CountingStore()

    async def body(store):
        await asyncio.gather(*(store.insert(_fields(n), seconds=5) for n in range(3)))
        return await _timed_insert(store, 3, seconds=0.04)  # 0.02 s of gathering at most

    waited = _run(store, body)

    assert store.batches == [3, 1]  # written, not left to expire in the queue
    assert waited < 0.04


def test_gathering_off_writes_whatever_is_queued_at_once(settings):
    settings.WEBHOOK_STORE_GATHER_SECONDS = 0
    store = CountingStore()

    async def body(store):
        await asyncio.gather(*(store.insert(_fields(n), seconds=5) for n in range(3)))
        return await _timed_insert(store, 3)

    assert _run(store, body) < 0.2
    assert store.batches == [3, 1]
