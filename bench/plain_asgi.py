"""A plain ASGI application for `POST /webhooks/<source>/`: the upper bound of this approach.

No Django, no checks, no group commit: the body, one INSERT of the same row on one of four
psycopg asyncio connections per process, its id answered. What the production server
(granian, the settings of eventdrop/web.py) gets through when the application does nearly
nothing, to hold the receive path against in the same run (docs/benchmarks.md, "Ingress
ACK"):

    .venv/bin/python bench/ingress_ack.py --baseline . --interleave 8 --connections 16 \\
        --ceiling-seconds 3 --baseline-env BENCH_APPLICATION=bench.plain_asgi:application

A GET answers 405, which is how the bench sees that a server is up.
"""

import asyncio
import hashlib
import os
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

CONNECTIONS = 4
INSERT = (
    "INSERT INTO ingress_rawevent (source, provider, method, path, query_string, headers, body,"
    " body_encryption, body_sha256, remote_addr, delivery_id, received_at, signature_status,"
    " rejection_reason, verify_count, event_type, provider_retry_reason, dedup_key,"
    " dispatch_status, processing_failures, processing_error, origin, payload_dropped_bytes,"
    " region) VALUES (%s, %s, %s, %s, %s, %s, %b, %s, %s, %s, %s, %s, 'pending', '', 0, '', '',"
    " '', 'waiting', 0, '', 'received', 0, '') RETURNING id"
)
_idle: asyncio.Queue | None = None


async def _connection() -> psycopg.AsyncConnection:
    global _idle
    if _idle is None:
        _idle = asyncio.Queue()
        for _ in range(CONNECTIONS):
            _idle.put_nowait(
                await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
            )
    return await _idle.get()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["method"] != "POST":
        await _answer(send, 405, b"{}")
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    connection = await _connection()
    try:
        cursor = await connection.execute(
            INSERT,
            (
                "stripe",
                "stripe",
                "POST",
                scope["path"],
                "",
                Jsonb(
                    {
                        name.decode("latin-1"): value.decode("latin-1")
                        for name, value in scope["headers"]
                    }
                ),
                body,
                "",
                hashlib.sha256(body).hexdigest(),
                scope["client"][0],
                "",
                datetime.now(UTC),
            ),
        )
        row = await cursor.fetchone()
    finally:
        assert _idle is not None
        _idle.put_nowait(connection)
    assert row is not None
    await _answer(send, 202, b'{"id": %d}' % row[0])


async def _answer(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
