"""Writes to the raw event store. The receive path calls exactly one of these
(raw_event_store); raw_events_rotate_keys is the encryption key rotation."""

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Q

from eventdrop.db import database_deadline
from ingress.encryption import BodyUndecryptable, encrypt_request, keyring, reencrypt_request
from ingress.models import RawEvent
from ingress.sources import Source

logger = logging.getLogger(__name__)


def raw_event_store(
    *,
    source: Source,
    method: str,
    path: str,
    query_string: str,
    headers: Mapping[str, str],
    body: bytes,
    remote_addr: str | None,
) -> RawEvent:
    """Persist one received request, exactly as received. One INSERT, nothing else.

    No explicit transaction: in autocommit mode the single INSERT is committed when it
    returns, which is the durability the 2xx promises. Wrapping it in atomic() would only
    add a BEGIN/COMMIT round trip to the hottest path we have.

    Everything here ends within WEBHOOK_STORE_TIMEOUT_SECONDS (eventdrop.db): opening a
    connection if this thread has none, the INSERT, and the one retry below. Past it, or on
    any other database error, DatabaseError propagates and nothing may be acknowledged.
    """
    delivery_id = headers.get(source.delivery_id_header, "") if source.delivery_id_header else ""
    # Encrypted here, in Python, before the one INSERT (when RAW_EVENT_ENCRYPTION_KEYS is
    # set); the hash is of the plaintext. Cost per request: docs/benchmarks.md.
    stored_body, stored_headers, body_encryption = encrypt_request(body, dict(headers))
    fields = {
        "source": source.name,
        "provider": source.provider,
        "method": method,
        "path": path,
        "query_string": query_string,
        "headers": stored_headers,
        "body": stored_body,
        "body_encryption": body_encryption,
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "remote_addr": remote_addr,
        "delivery_id": delivery_id[:255],
    }
    with database_deadline(settings.WEBHOOK_STORE_TIMEOUT_SECONDS):
        try:
            return RawEvent.objects.create(**fields)
        except (OperationalError, InterfaceError):
            if not _connection_lost():
                raise
            # The server hung up on this persistent connection (a restart the idle-socket
            # check did not see yet, a reset on send): reconnect once and INSERT again,
            # inside the same deadline. If the first INSERT did reach the server and commit
            # before the connection died, the event is stored twice; the inbox's dedup key
            # makes the copy a `duplicate`, so the provider's event is still handled once.
            connection.close()
            return RawEvent.objects.create(**fields)


def _connection_lost() -> bool:
    """psycopg saw the connection break (not a timeout of ours, not a refused connect)."""
    # Inside a transaction (never on the receive path) a new connection would silently
    # lose the statements before this one. SQLite connections never break this way.
    broken = getattr(connection.connection, "broken", False)
    return broken and not connection.in_atomic_block


@dataclass(frozen=True)
class KeyRotation:
    rewritten: int  # bodies written again under the first entry of the keys
    undecryptable: int  # bodies none of the configured keys could read (left as they are)
    batches: int


def raw_events_rotate_keys(*, batch_size: int = 500, max_batches: int | None = None) -> KeyRotation:
    """Rewrite every body not stored as RAW_EVENT_ENCRYPTION_KEYS' first entry says.

    Under the first key (a rotation, or encrypting what was stored before encryption was on),
    or as plaintext when the first entry is `plaintext` (turning encryption off). Walks the
    store in (received_at, id) order, `batch_size` rows per short transaction of its own, so
    webhooks and the inbox go on meanwhile; each row's lock wait is capped by the statement
    timeout. Safe to stop and run again: what is done is done. A body no key can read is
    counted and left alone (a key missing from the list, or a damaged row).
    """
    ring = keyring()
    cursor: tuple | None = None
    rewritten = undecryptable = batches = 0
    while max_batches is None or batches < max_batches:
        with transaction.atomic():
            rows = RawEvent.objects.select_for_update().exclude(body_encryption=ring.primary_id)
            if cursor is not None:
                rows = rows.filter(
                    Q(received_at__gt=cursor[0]) | Q(received_at=cursor[0], id__gt=cursor[1])
                )
            batch = list(
                rows.order_by("received_at", "id").only(
                    "id", "received_at", "body", "headers", "body_encryption"
                )[:batch_size]
            )
            if not batch:
                break
            batches += 1
            cursor = (batch[-1].received_at, batch[-1].id)
            updates = []
            for event in batch:
                try:
                    body, headers, scheme = reencrypt_request(
                        bytes(event.body), event.headers, event.body_encryption
                    )
                except BodyUndecryptable:
                    undecryptable += 1
                    continue
                updates.append((body, headers, scheme, event))
            _write_bodies(updates)
            rewritten += len(updates)
    logger.info(
        "ingress.raw_event_keys.rotated",
        extra={"rewritten": rewritten, "undecryptable": undecryptable, "batches": batches},
    )
    return KeyRotation(rewritten=rewritten, undecryptable=undecryptable, batches=batches)


def _write_bodies(updates: list[tuple[bytes, dict, str, RawEvent]]) -> None:
    # One pipelined executemany; `received_at` in the WHERE prunes to the day's partition.
    ops = connection.ops
    table = ops.quote_name(RawEvent._meta.db_table)
    sql = (
        f"UPDATE {table} SET body = %s, headers = %s::jsonb, body_encryption = %s "  # noqa: S608
        "WHERE id = %s AND received_at = %s"
    )
    rows = [
        (
            body,
            json.dumps(headers),
            scheme,
            event.id,
            ops.adapt_datetimefield_value(event.received_at),
        )
        for body, headers, scheme, event in updates
    ]
    if rows:
        with connection.cursor() as cursor:
            cursor.executemany(sql, rows)
