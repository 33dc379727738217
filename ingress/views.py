"""The receive path: the only code that runs on a provider's clock.

It answers from headers alone whatever it can (404/405/431/411/413/400), then stores the raw
request as one row and answers 202 with its id once that row is committed (the one INSERT may
carry the rows of other requests of this process arriving at the same moment: group commit,
ingress/store.py). A body that is not
exactly what its framing declared (cut short, broken chunks) is a 400 and is never stored.
No JSON parsing, no signature math, no business logic, no network call, no other query. The
one exception is Slack's `url_verification` handshake, which Slack requires to be answered
in the response, and which we only answer after its signature checks out.
"""

import logging
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import Histogram

from ingress.services import raw_event_store, raw_event_store_async
from ingress.sources import Source, get_source

logger = logging.getLogger(__name__)

# RFC 9110 7.6.1 hop-by-hop fields describe one connection, not the message; and the two
# credential-bearing headers are never kept (no provider of ours signs with them).
_DROPPED_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "authorization",
        "cookie",
    }
)
_READ_CHUNK = 64 * 1024

# ACK latency as far as this process sees it: from the view's first line to the committed
# row (header checks, body read, INSERT and commit; not the web server or the network).
# Observing costs a lock and a few additions in memory: no query, no I/O. With several
# worker processes PROMETHEUS_MULTIPROC_DIR makes prometheus_client keep it in a shared
# mmap'd file instead (docs/console.md). registry=None: only /metrics exports it
# (console/metrics.py), and the ops page reads its p99 (console/ops.py).
ACK_SECONDS = Histogram(
    "eventdrop_ingress_ack_seconds",
    "Seconds from the receive view's start to an acknowledged (stored) webhook.",
    ["source"],
    # 0.125 and 0.25 are the ops page's yellow and red lines for ACK p99 (SLO < 250 ms).
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.125, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=None,
)


def _error(status: int, code: str, message: str, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": code, "message": message}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _headers_as_received(meta: dict) -> tuple[dict[str, str], int]:
    """The header fields to store (lower-case names; hop-by-hop, credential-bearing and
    empty ones left out) and the bytes of all the request's header fields as sent
    (`name: value\r\n` each), in one pass over META."""
    headers: dict[str, str] = {}
    size = 0
    for key, value in meta.items():
        if key.startswith("HTTP_"):
            name = key[5:].replace("_", "-").lower()
        elif key == "CONTENT_TYPE" or key == "CONTENT_LENGTH":
            name = key.replace("_", "-").lower()
        else:
            continue
        size += len(name) + len(value) + 4
        if value != "" and name not in _DROPPED_HEADERS:
            headers[name] = value
    return headers, size


class _BodyTooLarge(Exception):
    pass


class _BodyUnreadable(Exception):
    pass


def _is_chunked(meta: dict) -> bool:
    return "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower()


def _read_body(request: HttpRequest, limit: int) -> bytes:
    """The body (never buffered past limit + one chunk), or _BodyTooLarge/_BodyUnreadable.

    With a Content-Length, Django's stream stops there. Without one, Django would read
    nothing at all; a server that has de-chunked the body says so with
    `wsgi.input_terminated` (gunicorn does), and then we read the raw input to its end.
    Some servers put an empty CONTENT_LENGTH in the environ rather than none: that is no
    length either (Django would read it as 0 and we would store an empty body).
    """
    stream = request if request.META.get("CONTENT_LENGTH") else request.META["wsgi.input"]
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = stream.read(_READ_CHUNK)
        except Exception as exc:
            # Whatever the server's reader raises (gunicorn: InvalidChunkSize, NoMoreData,
            # ChunkMissingTerminator; a reset socket: OSError), the body it was reading is
            # not one we can store: the client's framing is at fault, not our code.
            raise _BodyUnreadable(type(exc).__name__) from exc
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            raise _BodyTooLarge
        chunks.append(chunk)


def _slack_handshake(source: Source, headers: dict[str, str], body: bytes) -> str | None:
    if source.provider != "slack" or b"url_verification" not in body:
        return None
    from ingress.providers import verify
    from ingress.verifiers import StoredRequest

    verdict = verify(source, StoredRequest(headers=headers, body=body, received_at=timezone.now()))
    return verdict.handshake_challenge if verdict.ok else None


@dataclass(frozen=True)
class _Admitted:
    """A request that passed every check and is to be stored as it is."""

    source: Source
    fields: dict
    challenge: str | None
    started: float


def _admit(request: HttpRequest, source_name: str) -> JsonResponse | _Admitted:
    """Every check the receive path makes before the store (CPU only: the body is in memory),
    and the raw_event_store fields of a request that passed them; or the error answer."""
    started = time.perf_counter()
    source = get_source(source_name)
    if source is None:
        return _error(404, "unknown_source", f"No enabled webhook source named {source_name!r}.")
    if request.method != "POST":
        response = _error(405, "method_not_allowed", "Webhooks must be sent with POST.")
        response["Allow"] = "POST"
        return response

    headers, header_bytes = _headers_as_received(request.META)
    if header_bytes > source.max_header_bytes:
        # Headers are stored with the body: unbounded, they would be the body limit's back door.
        return _error(
            431,
            "headers_too_large",
            f"Headers of {header_bytes} bytes exceed this source's limit of "
            f"{source.max_header_bytes} bytes.",
        )

    raw_length = request.META.get("CONTENT_LENGTH", "")
    content_length: int | None = None
    if raw_length != "":
        try:
            content_length = int(raw_length)
        except ValueError:
            return _error(400, "bad_content_length", "Content-Length is not an integer.")
        if content_length < 0:
            return _error(400, "bad_content_length", "Content-Length is negative.")
        if content_length > source.max_body_bytes:
            return _error(
                413,
                "body_too_large",
                f"Body of {content_length} bytes exceeds this source's limit of "
                f"{source.max_body_bytes} bytes.",
            )
    elif not (_is_chunked(request.META) and request.META.get("wsgi.input_terminated")):
        # No length and no chunked framing: the body's end is unknowable (and a server that
        # does not de-chunk would hand us raw chunk framing).
        return _error(411, "length_required", "Send a Content-Length (or a chunked body).")

    if source.signature_header not in headers:
        return _error(
            400,
            "missing_signature",
            f"The {source.signature_header} header is required for this source.",
        )

    try:
        body = _read_body(request, source.max_body_bytes)
    except _BodyTooLarge:
        return _error(
            413,
            "body_too_large",
            f"Body exceeds this source's limit of {source.max_body_bytes} bytes.",
        )
    except _BodyUnreadable as exc:
        logger.warning(
            "ingress.receive.body_unreadable", extra={"source": source.name, "error": str(exc)}
        )
        return _error(400, "malformed_body", "The request body's framing is malformed.")
    if content_length is not None and len(body) != content_length:
        # Django's stream, like most servers', reports a client that stopped early as a
        # plain end of input: only the count tells a truncated body from a whole one.
        return _error(
            400,
            "truncated_body",
            f"The body ended after {len(body)} of the {content_length} bytes declared.",
        )

    return _Admitted(
        source=source,
        fields={
            "source": source,
            "method": request.method,
            "path": request.path,
            "query_string": request.META.get("QUERY_STRING", ""),
            "headers": headers,
            "body": body,
            "remote_addr": request.META.get("REMOTE_ADDR") or None,
        },
        challenge=_slack_handshake(source, headers, body),
        started=started,
    )


def _store_failed(source: Source) -> JsonResponse:
    # Nothing is stored, so nothing may be acknowledged: the provider must retry.
    logger.exception("ingress.receive.store_failed", extra={"source": source.name})
    return _error(
        503,
        "store_unavailable",
        "The event store is unavailable; retry later.",
        Retry_After=str(settings.INGRESS_UNAVAILABLE_RETRY_AFTER),
    )


# The histogram's child per source, looked up once (labels() takes a lock and builds a key
# on every call).
_ACK_SECONDS_BY_SOURCE: dict[str, Any] = {}


def _acknowledged(admitted: _Admitted, event_id: int) -> HttpResponse:
    # Only acknowledged requests: the SLO is on ACKs, and a 503 is not one.
    name = admitted.source.name
    histogram = _ACK_SECONDS_BY_SOURCE.get(name)
    if histogram is None:
        histogram = _ACK_SECONDS_BY_SOURCE[name] = ACK_SECONDS.labels(source=name)
    histogram.observe(time.perf_counter() - admitted.started)
    if admitted.challenge is not None:
        return JsonResponse({"challenge": admitted.challenge}, status=200)
    # json.dumps({"id": event_id, "status": "accepted"}) byte for byte, without building an
    # encoder per request: the answer every provider gets.
    return HttpResponse(
        b'{"id": %d, "status": "accepted"}' % event_id,
        status=202,
        content_type="application/json",
    )


@csrf_exempt
def receive_webhook(request: HttpRequest, source_name: str) -> HttpResponse:
    """The receive view under WSGI (make run, the test client): stored on this thread."""
    admitted = _admit(request, source_name)
    if isinstance(admitted, JsonResponse):
        return admitted
    try:
        event = raw_event_store(**admitted.fields)
    except DatabaseError:
        return _store_failed(admitted.source)
    return _acknowledged(admitted, event.pk)


@csrf_exempt
async def receive_webhook_on_the_loop(request: HttpRequest, source_name: str) -> HttpResponse:
    """The same view on the production server's event loop (ingress/urls_on_the_loop.py):
    the row joins the loop's group commit, with no thread involved."""
    admitted = _admit(request, source_name)
    if isinstance(admitted, JsonResponse):
        return admitted
    try:
        event_id = await raw_event_store_async(**admitted.fields)
    except DatabaseError:
        return _store_failed(admitted.source)
    return _acknowledged(admitted, event_id)
