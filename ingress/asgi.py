"""The receive path as an ASGI application: what the production server runs for `/webhooks/`.

eventdrop/asgi.py mounts it beside Django's own handler. It translates an ASGI request for
the core (ingress/receive.py) and the core's answer back, and adds what a server hands an
application but not Django's request handling: the Host check (Django's own public
functions over ALLOWED_HOSTS, as HttpRequest.get_host() applies them), the route
(`/webhooks/<source>/` or without the slash), the body, and the request's clock. No Django
request object, middleware or request signal is involved.

Time: a request's budget is its source's (its sender's own timeout: GitHub 10 s, Slack 3 s;
kernel/budgets.py). The server has already spent up to its header read timeout on the
head; what the budget leaves after it is one deadline for everything that follows: the body
read (within WEBHOOK_BODY_READ_TIMEOUT_SECONDS too; 408 past either), the wait in the
store's queue and the store (within WEBHOOK_STORE_TIMEOUT_SECONDS too; 503 + Retry-After past
either). A request joins the store's queue only once its body is whole, so a client that
sends slowly holds no place anybody ready to be stored waits for.

Memory, per process: at most `max_requests` webhook requests past their head at once (the
next one is answered 503 + Retry-After at once, its body unread), holding at most
`max_body_bytes` of bodies between them, counted as they arrive (a chunk past it: 503 +
Retry-After at once, nothing more read); a trickling client holds only what it has sent. A
body is one `bytes` object from here to the INSERT's parameters (joined once when it came in
several chunks). The server bounds connections and heads (eventdrop/web.py); the whole bound
is in docs/architecture.md ("Memory").
"""

import asyncio
import logging
import re
import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http.request import split_domain_port, validate_host
from opentelemetry.trace import Span, SpanKind

from ingress.receive import (
    Answer,
    Head,
    Refused,
    acknowledged,
    admit_body,
    admit_head,
    body_incomplete,
    body_too_large,
    store_unavailable,
)
from ingress.services import raw_event_store_async
from ingress.store import RawEventWriter
from kernel import tracing
from kernel.budgets import webhook_budget_seconds

logger = logging.getLogger(__name__)

PATH_PREFIX = "/webhooks/"
# The routes of ingress/urls.py: a slug, with or without the trailing slash.
_ROUTE = re.compile(r"/webhooks/([-a-zA-Z0-9_]+)/?")


class WebhookApp:
    """The ASGI application of `/webhooks/` (HTTP scopes only)."""

    def __init__(
        self,
        *,
        header_read_timeout_seconds: float,
        max_requests: int,
        max_body_bytes: int,
        store_connections: int,
    ) -> None:
        self.header_read_timeout_seconds = header_read_timeout_seconds
        self.max_requests = max_requests
        self.max_body_bytes = max_body_bytes
        self.writer = RawEventWriter(
            max_connections=store_connections,
            connect_seconds=settings.WEBHOOK_STORE_TIMEOUT_SECONDS,
        )
        self.requests = 0  # past their head, not yet answered
        self.body_bytes = 0  # held by those requests' bodies

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        status, headers, body = await self._answer(scope, receive)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (name.lower().encode("latin-1"), value.encode("latin-1"))
                        for name, value in headers
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
        except OSError:
            pass  # the client left (what was stored stays stored)

    async def _answer(self, scope: dict[str, Any], receive: Any) -> Answer:
        started = time.monotonic()
        try:
            head = self._head(scope)
        except Refused as refused:
            return refused.answer
        if not tracing.enabled():
            return await self._admitted_answer(head, receive, started, None)
        # The webhook's trace starts here (or under the traceparent a sender passed, as the
        # render service's callback does); its row keeps this span's context.
        span, token = tracing.enter("webhook receive", headers=head.headers, kind=SpanKind.SERVER)
        if span.is_recording():  # set only on a sampled span: most are not
            span.set_attributes(_receive_attributes(head))
        try:
            answer = await self._admitted_answer(head, receive, started, span)
            span.set_attribute("http.response.status_code", answer[0])
            return answer
        finally:
            tracing.leave(span, token)

    async def _admitted_answer(
        self, head: Head, receive: Any, started: float, span: Span | None
    ) -> Answer:
        if self.requests >= self.max_requests:
            return _busy(head, "requests").answer
        # The one deadline of everything after the head (the module docstring).
        budget = webhook_budget_seconds(head.source.timeout_seconds)
        deadline = started + budget - self.header_read_timeout_seconds
        self.requests += 1
        held = _BodyBytes(self)
        try:
            admitted = admit_body(head, await self._body(head, receive, held, deadline))
            seconds = min(settings.WEBHOOK_STORE_TIMEOUT_SECONDS, deadline - time.monotonic())
            storing = time.monotonic()
            try:
                event_id = await raw_event_store_async(
                    self.writer,
                    seconds=max(seconds, 0.0),
                    traceparent=tracing.traceparent_of(span) if span is not None else "",
                    **admitted.row,
                )
            except DatabaseError:
                return store_unavailable(admitted)
            finally:
                if span is not None and span.is_recording():
                    span.set_attribute("eventdrop.store_seconds", time.monotonic() - storing)
            if span is not None and span.is_recording():
                span.set_attribute("eventdrop.raw_event_id", event_id)
            return acknowledged(admitted, event_id)
        except Refused as refused:
            return refused.answer
        finally:
            self.requests -= 1
            held.release()

    def _head(self, scope: dict[str, Any]) -> Head:
        fields = [
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]
        ]
        _check_host(fields, scope)
        path = scope["path"]
        route = _ROUTE.fullmatch(path)
        if route is None:
            raise Refused(404, "not_found", f"No webhook route at {path!r}.")
        client = scope.get("client")
        return admit_head(
            route.group(1),
            scope["method"],
            path,
            scope["query_string"].decode("latin-1"),
            fields,
            client[0] if client else None,
            dechunked=True,  # the server hands every body over de-chunked
        )

    async def _body(self, head: Head, receive: Any, held: "_BodyBytes", deadline: float) -> bytes:
        """The whole body, read within the source's limit, the process's body bytes, the body
        read deadline and the request's own deadline."""
        limit = head.source.max_body_bytes
        seconds = min(settings.WEBHOOK_BODY_READ_TIMEOUT_SECONDS, deadline - time.monotonic())
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(max(seconds, 0.0)):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        # The client stopped before the body's end (or broke its chunked
                        # framing, which the server reports the same way).
                        raise body_incomplete(head, size)
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise body_too_large(head)
                    held.take(len(chunk), head)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise Refused(
                408,
                "body_read_timeout",
                f"The request body did not arrive within {max(seconds, 0.0):g} s.",
            ) from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _BodyBytes:
    """What one request's body holds of its process's `max_body_bytes`, given back when it is
    answered. One event loop per process: plain counters, no lock."""

    def __init__(self, app: WebhookApp) -> None:
        self.app = app
        self.held = 0

    def take(self, size: int, head: Head) -> None:
        if self.app.body_bytes + size > self.app.max_body_bytes:
            raise _busy(head, "body bytes")
        self.app.body_bytes += size
        self.held += size

    def release(self) -> None:
        self.app.body_bytes -= self.held
        self.held = 0


def _receive_attributes(head: Head) -> dict[str, str]:
    source = head.source
    header = source.delivery_id_header
    delivery_id = head.headers.get(header, "") if header else ""
    return {
        "eventdrop.source": source.name,
        "eventdrop.delivery_id": delivery_id[:255],
        "http.request.method": head.method,
    }


def _busy(head: Head, limit: str) -> Refused:
    """This process is at one of its limits: the provider is to retry, as for a store that is
    unavailable (nothing stored, nothing acknowledged)."""
    logger.warning("ingress.receive.busy", extra={"source": head.source.name, "limit": limit})
    return Refused(
        503,
        "busy",
        "This server is at its limit of webhooks in progress; retry later.",
        ("Retry-After", str(settings.INGRESS_UNAVAILABLE_RETRY_AFTER)),
    )


def _check_host(fields: list[tuple[str, str]], scope: dict[str, Any]) -> None:
    """HttpRequest.get_host()'s verdict, from Django's public functions: the Host (or
    X-Forwarded-Host, when trusted) must be in ALLOWED_HOSTS."""
    wanted = "x-forwarded-host" if settings.USE_X_FORWARDED_HOST else "host"
    host = next((value for name, value in fields if name == wanted), None)
    if host is None:
        host = next((value for name, value in fields if name == "host"), None)
    if host is None:
        server = scope.get("server") or ("", "")
        host = f"{server[0]}:{server[1]}"
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(host)
    if not (domain and validate_host(domain, allowed)):
        raise Refused(400, "disallowed_host", "The Host header is not one this server serves.")
