"""The receive path as a Django view, for the test client and a deployment that serves Django
alone (WSGI): the request's META translated for the core (ingress/receive.py), the row stored
by the group commit's statement on this thread."""

import logging
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from ingress.receive import (
    Answer,
    Head,
    Refused,
    acknowledged,
    admit_body,
    admit_head,
    body_too_large,
    malformed_body,
    store_unavailable,
)
from ingress.services import raw_event_store

logger = logging.getLogger(__name__)

_READ_CHUNK = 64 * 1024


@csrf_exempt
def receive_webhook(request: HttpRequest, source_name: str) -> HttpResponse:
    """The receive path as a Django view (make run, the test client, Django alone): the
    request's META translated for the core, the row stored with the ORM on this thread."""
    meta = request.META
    try:
        head = admit_head(
            source_name,
            request.method or "",
            request.path,
            meta.get("QUERY_STRING", ""),
            _meta_fields(meta),
            meta.get("REMOTE_ADDR") or None,
            dechunked=bool(meta.get("wsgi.input_terminated")),
        )
        admitted = admit_body(head, _read_body(request, head))
    except Refused as refused:
        return _response(refused.answer)
    try:
        event = raw_event_store(**admitted.row)
    except DatabaseError:
        return _response(store_unavailable(admitted))
    return _response(acknowledged(admitted, event.pk))


def _meta_fields(meta: dict[str, Any]) -> list[tuple[str, str]]:
    fields = []
    for key, value in meta.items():
        if key.startswith("HTTP_"):
            fields.append((key[5:].replace("_", "-").lower(), value))
        elif key == "CONTENT_TYPE" or key == "CONTENT_LENGTH":
            fields.append((key.replace("_", "-").lower(), value))
    return fields


def _read_body(request: HttpRequest, head: Head) -> bytes:
    """The body, never buffered past the limit + one chunk.

    With a Content-Length, Django's stream stops there. Without one Django would read
    nothing at all: a server that de-chunked the body (admit_head checked it says so) is read
    from its raw input to the end.
    """
    stream: Any = request if head.content_length is not None else request.META["wsgi.input"]
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = stream.read(_READ_CHUNK)
        except Exception as exc:
            # Whatever the server's reader raises (gunicorn: InvalidChunkSize, NoMoreData,
            # ChunkMissingTerminator; a reset socket: OSError), the body it was reading is
            # not one we can store: the client's framing is at fault, not our code.
            logger.warning(
                "ingress.receive.body_unreadable",
                extra={"source": head.source.name, "error": type(exc).__name__},
            )
            raise malformed_body() from exc
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > head.source.max_body_bytes:
            raise body_too_large(head)
        chunks.append(chunk)


def _response(answer: Answer) -> HttpResponse:
    status, headers, body = answer
    return HttpResponse(body, status=status, headers=dict(headers))
