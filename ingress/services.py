"""Writes to the raw event store. The receive path calls exactly one of these."""

import hashlib
from collections.abc import Mapping

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from eventdrop.db import database_deadline
from ingress.models import RawEvent
from ingress.sources import Source


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
    fields = {
        "source": source.name,
        "provider": source.provider,
        "method": method,
        "path": path,
        "query_string": query_string,
        "headers": dict(headers),
        "body": body,
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
