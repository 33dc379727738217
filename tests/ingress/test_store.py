"""The ASGI path's group commit (ingress/store.py) on the real database: what a batch
writes, in what order, and that one bad row fails alone."""

import asyncio
from datetime import UTC, datetime

import pytest
from django.db import DataError

from ingress.models import RawEvent
from ingress.store import RawEventWriter

pytestmark = pytest.mark.django_db(transaction=True)


def row(n: int, **overrides) -> dict:
    return {
        "source": "stripe",
        "provider": "stripe",
        "method": "POST",
        "path": "/webhooks/stripe/",
        "query_string": f"n={n}",
        # Characters a JSON document must escape, and latin-1 from a header's bytes.
        "headers": {"content-type": "application/json", "x-odd": 'quote " back\\ é\t'},
        # Every byte value, NUL included: stored exactly.
        "body": bytes(range(256)) * 2 + n.to_bytes(4, "big"),
        "body_encryption": "",
        "body_sha256": f"{n:064x}",
        "remote_addr": "127.0.0.1",
        "delivery_id": f"evt_{n}",
        "received_at": datetime(2026, 12, 4, 12, 0, n % 60, 123456, tzinfo=UTC),
        **overrides,
    }


async def store_at_once(rows: list[dict]) -> list[int | BaseException]:
    # One connection: the rows queued while its first INSERT runs go in one batch.
    writer = RawEventWriter(max_connections=1, connect_seconds=5)
    try:
        return await asyncio.gather(
            *(writer.insert(fields, seconds=10) for fields in rows), return_exceptions=True
        )
    finally:
        await writer.aclose()


def test_a_batch_stores_every_value_exactly_and_ids_follow_the_rows():
    rows = [row(n) for n in range(20)]
    ids = [pk for pk in asyncio.run(store_at_once(rows)) if isinstance(pk, int)]
    assert len(ids) == len(rows)
    assert ids == sorted(ids)
    for pk, fields in zip(ids, rows, strict=True):
        stored = RawEvent.objects.get(pk=pk)
        for name, value in fields.items():
            assert getattr(stored, name) == value, name
        # The columns the rows do not set hold their model defaults.
        assert stored.signature_status == RawEvent._meta.get_field("signature_status").default
        assert stored.verify_count == 0


def test_a_row_the_database_refuses_fails_alone():
    rows = [row(1), row(2, remote_addr="not an address"), row(3)]
    first, refused, third = asyncio.run(store_at_once(rows))
    assert isinstance(refused, DataError)
    assert isinstance(first, int) and isinstance(third, int)
    assert RawEvent.objects.filter(pk__in=[first, third]).count() == 2
    assert RawEvent.objects.count() == 2
