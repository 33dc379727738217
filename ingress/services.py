"""Writes to the raw event store. The receive path calls exactly one of these."""

import hashlib
from collections.abc import Mapping

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
    """
    delivery_id = headers.get(source.delivery_id_header, "") if source.delivery_id_header else ""
    return RawEvent.objects.create(
        source=source.name,
        provider=source.provider,
        method=method,
        path=path,
        query_string=query_string,
        headers=dict(headers),
        body=body,
        body_sha256=hashlib.sha256(body).hexdigest(),
        remote_addr=remote_addr,
        delivery_id=delivery_id[:255],
    )
