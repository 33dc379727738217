"""The receive path: the only code that runs on a provider's clock.

One core and two thin adapters. The core works on a plain request (method, path, header
fields, body, peer) and knows nothing of the server or of Django's request handling:
`admit_head` answers from the head alone whatever it can (404/405/431/400/413/411/400), the
adapter reads the body within the source's limit, `admit_body` refuses a body that is not
what its framing declared (400) and answers Slack's handshake, then the adapter stores the
row with one INSERT and answers with `acknowledged` (202 with the row's id) or
`store_unavailable` (503 + Retry-After: nothing stored, nothing acknowledged).

The adapters only translate:
- ingress/asgi.py, an ASGI application: what the production server runs for `/webhooks/`
  (eventdrop/asgi.py, and `make run`); it reads the body under a deadline and stores on the
  process's asyncio connections (`raw_event_store_async`, the group commit);
- ingress/views.py, a Django view: the test client and a deployment that serves Django alone
  (WSGI); it stores the same row by the same statement on its thread (`raw_event_store`).

No JSON parsing, no signature math, no business logic, no network call, no other query. The
one exception is Slack's `url_verification` handshake, which Slack requires to be answered
in the response, and which is answered only after its signature checks out.
"""

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone
from prometheus_client import Histogram

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

# ACK latency as far as this process sees it: from the request's head being admitted to the
# committed row (header checks, body read, INSERT and commit; not the web server or the
# network). Observing costs a lock and a few additions in memory: no query, no I/O. With
# several worker processes PROMETHEUS_MULTIPROC_DIR makes prometheus_client keep it in a
# shared mmap'd file instead (docs/console.md). registry=None: only /metrics exports it
# (console/ops/metrics.py), and the ops page reads its p99 (console/ops/figures.py).
ACK_SECONDS = Histogram(
    "eventdrop_ingress_ack_seconds",
    "Seconds from the receive view's start to an acknowledged (stored) webhook.",
    ["source"],
    # 0.125 and 0.25 are the ops page's yellow and red lines for ACK p99 (SLO < 250 ms).
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.125, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=None,
)

# An answer: status, header fields, body (always JSON).
Answer = tuple[int, list[tuple[str, str]], bytes]


class Refused(Exception):
    """The request is answered without a row, with this JSON error."""

    def __init__(self, status: int, code: str, message: str, *extra: tuple[str, str]):
        super().__init__(status, code)
        self.answer = error(status, code, message, *extra)


def error(status: int, code: str, message: str, *extra: tuple[str, str]) -> Answer:
    body = json.dumps({"error": code, "message": message}).encode()
    return status, [("Content-Type", "application/json"), *extra], body


@dataclass(frozen=True, slots=True)
class Head:
    """A request whose head passed every check: its body is to be read, at most
    `source.max_body_bytes` of it."""

    source: Source
    method: str
    path: str
    query_string: str
    headers: dict[str, str]  # the fields to store
    content_length: int | None
    peer: str | None
    started: float


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request that passed every check and is to be stored as it is."""

    head: Head
    body: bytes
    challenge: str | None  # Slack's handshake, answered once the row is stored

    @property
    def row(self) -> dict[str, Any]:
        """raw_event_store's arguments."""
        head = self.head
        return {
            "source": head.source,
            "method": head.method,
            "path": head.path,
            "query_string": head.query_string,
            "headers": head.headers,
            "body": self.body,
            "remote_addr": head.peer,
        }


def admit_head(
    source_name: str,
    method: str,
    path: str,
    query_string: str,
    fields: list[tuple[str, str]],
    peer: str | None,
    *,
    dechunked: bool,
) -> Head:
    """Every check made from the head alone, or Refused. `fields` are the header fields as
    received (lower-case names); `dechunked` says the server hands over a chunked body whole
    and de-chunked (an ASGI server always does; a WSGI server says so with
    `wsgi.input_terminated`), so one without a Content-Length can be read."""
    started = time.perf_counter()
    source = get_source(source_name)
    if source is None:
        raise Refused(404, "unknown_source", f"No enabled webhook source named {source_name!r}.")
    if method != "POST":
        raise Refused(
            405, "method_not_allowed", "Webhooks must be sent with POST.", ("Allow", "POST")
        )
    headers: dict[str, str] = {}
    size = 0
    for name, value in fields:
        size += len(name) + len(value) + 4  # `name: value\r\n` as sent
        if value != "" and name not in _DROPPED_HEADERS:
            # A field sent twice is one field, its values joined (RFC 9110 5.3), as WSGI
            # servers join them.
            headers[name] = f"{headers[name]},{value}" if name in headers else value
    if size > source.max_header_bytes:
        # Headers are stored with the body: unbounded, they would be the body limit's back door.
        raise Refused(
            431,
            "headers_too_large",
            f"Headers of {size} bytes exceed this source's limit of "
            f"{source.max_header_bytes} bytes.",
        )
    raw_length = headers.get("content-length", "")
    content_length: int | None = None
    if raw_length != "":
        try:
            content_length = int(raw_length)
        except ValueError:
            raise Refused(400, "bad_content_length", "Content-Length is not an integer.") from None
        if content_length < 0:
            raise Refused(400, "bad_content_length", "Content-Length is negative.")
        if content_length > source.max_body_bytes:
            raise Refused(
                413,
                "body_too_large",
                f"Body of {content_length} bytes exceeds this source's limit of "
                f"{source.max_body_bytes} bytes.",
            )
    elif not (dechunked and _is_chunked(fields)):
        # No length and no chunked framing: the body's end is unknowable (and a server that
        # does not de-chunk would hand over raw chunk framing).
        raise Refused(411, "length_required", "Send a Content-Length (or a chunked body).")
    if source.signature_header not in headers:
        raise Refused(
            400,
            "missing_signature",
            f"The {source.signature_header} header is required for this source.",
        )
    return Head(source, method, path, query_string, headers, content_length, peer, started)


def _is_chunked(fields: list[tuple[str, str]]) -> bool:
    return any(name == "transfer-encoding" and "chunked" in value.lower() for name, value in fields)


def body_too_large(head: Head) -> Refused:
    limit = head.source.max_body_bytes
    return Refused(413, "body_too_large", f"Body exceeds this source's limit of {limit} bytes.")


def body_incomplete(head: Head, received: int) -> Refused:
    """The client stopped (or broke the chunked framing) before the body's end."""
    if head.content_length is not None:
        return Refused(
            400,
            "truncated_body",
            f"The body ended after {received} of the {head.content_length} bytes declared.",
        )
    return malformed_body()


def malformed_body() -> Refused:
    return Refused(400, "malformed_body", "The request body's framing is malformed.")


def admit_body(head: Head, body: bytes) -> Admitted:
    """The whole body (read within the source's limit): exactly what its framing declared,
    or Refused; Slack's handshake verified if it is one."""
    if head.content_length is not None and len(body) != head.content_length:
        # Most servers report a client that stopped early as a plain end of input: only the
        # count tells a truncated body from a whole one.
        raise body_incomplete(head, len(body))
    return Admitted(head, body, _slack_handshake(head.source, head.headers, body))


def _slack_handshake(source: Source, headers: dict[str, str], body: bytes) -> str | None:
    if source.provider != "slack" or b"url_verification" not in body:
        return None
    from ingress.providers import verify
    from ingress.verifiers import StoredRequest

    verdict = verify(source, StoredRequest(headers=headers, body=body, received_at=timezone.now()))
    return verdict.handshake_challenge if verdict.ok else None


# The histogram's child per source, looked up once (labels() takes a lock and builds a key
# on every call).
_ACK_SECONDS_BY_SOURCE: dict[str, Any] = {}


def acknowledged(admitted: Admitted, event_id: int) -> Answer:
    """The answer once the row is committed."""
    # Only acknowledged requests: the SLO is on ACKs, and a 503 is not one.
    name = admitted.head.source.name
    histogram = _ACK_SECONDS_BY_SOURCE.get(name)
    if histogram is None:
        histogram = _ACK_SECONDS_BY_SOURCE[name] = ACK_SECONDS.labels(source=name)
    histogram.observe(time.perf_counter() - admitted.head.started)
    if admitted.challenge is not None:
        body = json.dumps({"challenge": admitted.challenge}).encode()
        return 200, [("Content-Type", "application/json")], body
    # json.dumps({"id": event_id, "status": "accepted"}) byte for byte.
    return (
        202,
        [("Content-Type", "application/json")],
        b'{"id": %d, "status": "accepted"}' % (event_id),
    )


def store_unavailable(admitted: Admitted) -> Answer:
    """The answer when the row could not be committed within the store deadline."""
    # Nothing is stored, so nothing may be acknowledged: the provider must retry.
    logger.exception("ingress.receive.store_failed", extra={"source": admitted.head.source.name})
    return error(
        503,
        "store_unavailable",
        "The event store is unavailable; retry later.",
        ("Retry-After", str(settings.INGRESS_UNAVAILABLE_RETRY_AFTER)),
    )
