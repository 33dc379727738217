"""The receive path as an ASGI application: what the production server runs for `/webhooks/`.

eventdrop/asgi.py mounts it beside Django's own handler. It translates an ASGI request for
the core (ingress/views.py) and the core's answer back, and adds what a server hands an
application but not Django's request handling: the Host check (Django's own public
functions over ALLOWED_HOSTS, as HttpRequest.get_host() applies them), the route
(`/webhooks/<source>/` or without the slash) and the body, read within the source's limit and
under one deadline for all of it (WEBHOOK_BODY_READ_TIMEOUT_SECONDS; 408 past it). No Django
request object, middleware or request signal is involved.

Memory: a request holds at most its source's `max_body_bytes` of body (past it, 413 and no
more is read) beside its head; the server bounds the head (WEB_MAX_HEADER_BYTES) and how many
connections a process serves at once (WEB_MAX_CONCURRENT_REQUESTS), so what bodies hold in a
web process is at most WEB_MAX_CONCURRENT_REQUESTS x (WEB_MAX_HEADER_BYTES + the largest
max_body_bytes) (eventdrop/web.py, docs/architecture.md).
"""

import asyncio
import re
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.http.request import split_domain_port, validate_host

from ingress.services import raw_event_store_async
from ingress.store import RawEventWriter
from ingress.views import (
    Head,
    Refused,
    acknowledged,
    admit_body,
    admit_head,
    body_incomplete,
    body_too_large,
    store_unavailable,
)

PATH_PREFIX = "/webhooks/"
# The routes of ingress/urls.py: a slug, with or without the trailing slash.
_ROUTE = re.compile(r"/webhooks/([-a-zA-Z0-9_]+)/?")


class WebhookApp:
    """The ASGI application of `/webhooks/` (HTTP scopes only)."""

    def __init__(self, *, body_read_timeout_seconds: float, store_connections: int) -> None:
        self.body_read_timeout_seconds = body_read_timeout_seconds
        self.writer = RawEventWriter(max_connections=store_connections)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            head = self._head(scope)
            admitted = admit_body(head, await self._body(head, receive))
        except Refused as refused:
            answer = refused.answer
        else:
            try:
                event_id = await raw_event_store_async(self.writer, **admitted.row)
            except DatabaseError:
                answer = store_unavailable(admitted)
            else:
                answer = acknowledged(admitted, event_id)
        status, headers, body = answer
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

    async def _body(self, head: Head, receive: Any) -> bytes:
        """The whole body, read within the source's limit and the body read deadline."""
        limit = head.source.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_read_timeout_seconds):
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
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise Refused(
                408,
                "body_read_timeout",
                f"The request body did not arrive within {self.body_read_timeout_seconds:g} s.",
            ) from None
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


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
