"""The production web server: uvicorn (httptools on uvloop) in front of Django.

`python -m eventdrop.web` is the Procfile's `web` line. Why this shape (measured in
docs/benchmarks.md, "The production web server: gunicorn → granian" and "granian → uvicorn"):

- A thread-per-request server (gunicorn gthread, granian's WSGI mode) lends a Python thread
  to a request as soon as its headers are in, and that thread then waits on the client for
  the body. Issue 8 saw ~16 clients sending 1 byte/s block every other sender; with 32 of
  them gunicorn's ACK rate fell from ~600/s to 198/s, and webhooks waited past their
  client's 10 s timeout.
- Here the server speaks HTTP on its event loop, and `BufferedBody` (below) collects the
  whole body there — within `WEBHOOK_BODY_READ_TIMEOUT_SECONDS`, and at most
  `max_body_bytes` — before any of the app sees the request. A slow client costs a
  coroutine and a few kilobytes while it lasts, never a thread, and it is cut off with 408
  at the deadline. Only complete bodies reach the receive view, so the view's own limits,
  its one INSERT and its 503 work exactly as under any WSGI server. A request's head is
  bounded by the server's protocol (eventdrop/web_protocol.py): a deadline, and 431 past a
  size.
- `/webhooks/` never leaves the event loop (`WebhooksOnTheLoop`, issue 15): the receive
  view's coroutine twin runs there behind only the middleware a provider's POST needs, in
  Django's order and with Django's error handling but without BaseHandler's general-purpose
  machinery (`WebhookChain`), and the rows of the requests
  waiting at the same moment share one INSERT and one commit on the loop's own asyncio
  connections (ingress/store.py, LoopGroupCommit). The HTTP parsing runs on that same
  thread, so per webhook there is no thread hop at all: under granian, whose HTTP runs on
  Rust threads that hand each request to the loop, those hops were most of what a webhook
  cost (docs/benchmarks.md).
- Everything else (console, API, metrics: sync views, the ORM) goes to `DjangoThreads`,
  Django's WSGI handler on a thread pool with one hop from the loop to a thread and back per
  request (not Django's ASGI handler, which runs every sync view on one shared thread: 146
  webhooks/s where gunicorn did 729).
- A body the server cannot complete (shorter than its Content-Length when the client
  half-closes, broken chunked framing) arrives as `http.disconnect`: it is answered 400 if
  the connection still takes an answer, and never reaches Django, so it is never stored.

Settings come from the environment: `PORT` (8000), `WEB_BIND` or `HOST` (127.0.0.1: binding
every interface is a deployment decision, not a default), `WEB_CONCURRENCY` (processes, 2),
`WEB_THREADS` (Django threads per process, 4, each with its database connection: the console
and API), `WEB_STORE_CONNECTIONS` (1: the asyncio connections per process that write
webhooks), `WEB_HEADER_READ_TIMEOUT_SECONDS` (5: a request's line and headers must arrive
within it) and `WEB_MAX_HEADER_BYTES` (64 KiB: 431 past it; the receive view bounds each
source lower, `max_header_bytes`), `WEB_KEEP_ALIVE_SECONDS` (75: how long an idle keep-alive
connection stays open), `WEB_MAX_CONCURRENT_REQUESTS` (64 per process: at most that many
bodies are buffered at once, each at most the body limit; the others wait unread) and
`ACK_ROLLUP_FLUSH_SECONDS` (60; 0 turns it off): how often each process adds what its ACK
histogram counted to the database for the ops page's ACK p99 chart (console/ack_rollup.py).
"""

import asyncio
import io
import json
import os
import shutil
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from asgiref.sync import sync_to_async

HTTP_DISCONNECT = "http.disconnect"
# How long the server waits at shutdown for requests in flight, which end within their own
# deadlines anyway (header read + body read + store: ingress.E003 holds them to the webhook's
# budget).
GRACEFUL_SHUTDOWN_SECONDS = 30


@dataclass(frozen=True)
class WebServerConfig:
    host: str
    port: int
    processes: int
    threads: int
    header_read_timeout_seconds: float
    max_header_bytes: int
    ack_rollup_flush_seconds: float = 60
    max_concurrent_requests: int = 64
    store_connections: int = 1
    keep_alive_seconds: int = 75

    def __post_init__(self) -> None:
        if self.processes < 1 or self.threads < 1:
            raise ValueError("WEB_CONCURRENCY and WEB_THREADS must be at least 1")
        if not 0 < self.header_read_timeout_seconds <= 60:
            raise ValueError("WEB_HEADER_READ_TIMEOUT_SECONDS must be above 0 and at most 60")
        if self.keep_alive_seconds <= 0:
            raise ValueError("WEB_KEEP_ALIVE_SECONDS must be above 0")
        if self.ack_rollup_flush_seconds < 0:
            raise ValueError("ACK_ROLLUP_FLUSH_SECONDS must be 0 (off) or above")
        if self.store_connections < 1:
            raise ValueError("WEB_STORE_CONNECTIONS must be at least 1")
        if self.max_concurrent_requests < self.threads:
            raise ValueError("WEB_MAX_CONCURRENT_REQUESTS must be at least WEB_THREADS")

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> "WebServerConfig":
        env = os.environ if environ is None else environ
        return cls(
            host=env.get("WEB_BIND") or env.get("HOST") or "127.0.0.1",
            port=int(env.get("PORT") or 8000),
            processes=int(env.get("WEB_CONCURRENCY") or 2),
            threads=int(env.get("WEB_THREADS") or 4),
            header_read_timeout_seconds=float(env.get("WEB_HEADER_READ_TIMEOUT_SECONDS") or 5),
            # The request line and headers; never below 8 KiB, which every provider's head
            # fits in (nginx's default buffer for one long header line).
            max_header_bytes=max(8192, int(env.get("WEB_MAX_HEADER_BYTES") or 64 * 1024)),
            ack_rollup_flush_seconds=float(env.get("ACK_ROLLUP_FLUSH_SECONDS") or 60),
            max_concurrent_requests=int(env.get("WEB_MAX_CONCURRENT_REQUESTS") or 64),
            store_connections=int(env.get("WEB_STORE_CONNECTIONS") or 1),
            keep_alive_seconds=int(env.get("WEB_KEEP_ALIVE_SECONDS") or 75),
        )


# What a responder returns and BufferedBody sends: status, header fields, the whole body.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class Responder(Protocol):
    async def respond(self, scope: dict, body: bytes) -> Answer: ...


def json_answer(status: int, code: str, message: str) -> Answer:
    body = json.dumps({"error": code, "message": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        # The request body was not consumed: the connection cannot carry another request.
        (b"connection", b"close"),
    ]
    return status, headers, body


class BufferedBody:
    """The ASGI app the server runs: a responder gets only requests whose body arrived whole
    and in time, and gets that body as bytes.

    The body is read on the event loop under one deadline for all of it (not per read: a
    client sending a byte a second never idles long enough to trip a per-read timeout).
    Past `max_body_bytes` it stops reading and answers 413, so memory per request stays
    bounded; the receive view applies each source's own, lower, limit to what gets through.
    Then `/webhooks/` goes to `webhooks` (on this loop), everything else to `rest` (the
    threads), and their answer is sent from here.

    One layer, not a chain of ASGI middleware (a body buffer, a path router, a lifespan
    handler), each re-sending the messages of the one inside it: on the webhook those layers
    and the body replayed through a second receive() cost more than a tenth of the ACK rate
    (docs/benchmarks.md, "One ASGI layer").
    """

    def __init__(
        self,
        *,
        webhooks: Responder,
        rest: Responder,
        timeout_seconds: float,
        max_body_bytes: int,
        max_in_flight: int,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
    ):
        self.webhooks, self.rest = webhooks, rest
        self.timeout_seconds = timeout_seconds
        self.max_body_bytes = max_body_bytes
        # At most this many requests buffer a body or wait for their answer at once; the
        # rest wait here, before their body is read (the server pauses reading a connection
        # whose unread body passes 64 KiB). So what bodies hold in memory is bounded by
        # max_in_flight x max_body_bytes, however many clients connect.
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self.on_shutdown = on_shutdown

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # the server runs with websockets off
        async with self._in_flight:
            body = await self._body(scope, receive)
            if isinstance(body, tuple):
                status, headers, answer = body
            elif scope["path"].startswith(WEBHOOK_PATH_PREFIX):
                status, headers, answer = await self.webhooks.respond(scope, body)
            else:
                status, headers, answer = await self.rest.respond(scope, body)
        try:
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": answer})
        except (OSError, RuntimeError):
            pass  # the client left (perhaps while the view ran: what it stored is stored)

    async def _body(self, scope, receive) -> bytes | Answer:
        """The whole body, or the answer to a request whose body cannot be had."""
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
                break
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return json_answer(413, "body_too_large", self._too_large_message())
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.timeout_seconds):
                while True:
                    message = await receive()
                    if message["type"] == HTTP_DISCONNECT:
                        return json_answer(400, *self._incomplete(declared, size))
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        return json_answer(413, "body_too_large", self._too_large_message())
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            return json_answer(
                408,
                "body_read_timeout",
                f"The request body did not arrive within {self.timeout_seconds:g} s.",
            )
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _lifespan(self, receive, send) -> None:
        # Nothing to do at start-up; at shutdown the webhook store's asyncio connections
        # are closed.
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.on_shutdown is not None:
                    await self.on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _too_large_message(self) -> str:
        return f"Body exceeds the server's limit of {self.max_body_bytes} bytes."

    @staticmethod
    def _incomplete(declared: bytes | None, size: int) -> tuple[str, str]:
        if declared is not None:
            return (
                "truncated_body",
                f"The body ended after {size} of the {declared.decode()} bytes declared.",
            )
        return "malformed_body", "The chunked body is malformed or ended before its last chunk."


class DjangoThreads:
    """Responder: run a WSGI app (Django) on a pool of `threads` threads, one hop per request.

    a2wsgi's WSGIMiddleware does this too, but crosses between the loop and the thread for
    every message (start, each body chunk, the end); measured on the webhook route that cost
    up to a third of its ACK rate (docs/benchmarks.md). Here the thread runs the whole WSGI
    call and hands back the finished response. That buffers responses, which suits this app:
    none of its views streams. The environ is a2wsgi's (`build_environ`), the subtle part.
    """

    def __init__(self, app, *, threads: int):
        from concurrent.futures import ThreadPoolExecutor

        self.app = app
        # Each thread keeps its own database connection (CONN_MAX_AGE), as under gunicorn.
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="django")

    async def respond(self, scope: dict, body: bytes) -> Answer:
        from a2wsgi.wsgi import build_environ

        environ = build_environ(scope, io.BytesIO(body))  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self._call, self.app, environ)

    @staticmethod
    def _call(app, environ) -> Answer:
        response: dict = {}
        written: list[bytes] = []

        def start_response(status: str, headers: list, exc_info=None):
            # Nothing has been sent yet (the response is buffered), so a late error
            # response (exc_info) simply replaces the first one. Django's Set-Cookie values
            # start with a space (SimpleCookie.output(header="")).
            response["status"] = int(status.split(" ", 1)[0])
            response["headers"] = [
                (name.strip().lower().encode("latin-1"), value.strip().encode("latin-1"))
                for name, value in headers
            ]
            return written.append  # PEP 3333's legacy write()

        iterable = app(environ, start_response)
        try:
            body = b"".join([*written, *iterable])
        finally:
            if hasattr(iterable, "close"):
                iterable.close()
        return response["status"], response["headers"], body


# The middleware a webhook needs, of those settings.MIDDLEWARE lists (in its order): security
# headers and the HTTPS redirect, and CommonMiddleware's Host check (ALLOWED_HOSTS, 400).
# Not sessions, CSRF (the receive view is exempt), auth, messages, the replica router (the
# receive path only writes) or X-Frame-Options (a JSON answer to a provider's POST).
WEBHOOK_MIDDLEWARE = frozenset(
    {
        "django.middleware.security.SecurityMiddleware",
        "django.middleware.common.CommonMiddleware",
    }
)
WEBHOOK_PATH_PREFIX = "/webhooks/"
# The URLconf of every webhook request on the loop: the same routes, the coroutine view.
WEBHOOK_URLCONF = "ingress.urls_on_the_loop"


class WebhookChain:
    """Django's request handling for `/webhooks/`, on the event loop: the loop URLconf's view
    behind WEBHOOK_MIDDLEWARE, without BaseHandler's general-purpose machinery.

    It does what Django's handler does for these requests, in the same order: each
    middleware's `process_request` outside in (the first to return a response ends the way
    in), the view, each `process_response` inside out. An exception becomes a response at the
    layer that raised it, by Django's own `response_for_exception` (DisallowedHost 400, Http404
    404 through the URLconf's handler, anything else a logged 500 with `got_request_exception`
    sent), and the layers outside that one still see the response, as under
    `convert_exception_to_response`; a 4xx or 5xx answer is logged as Django logs it.

    What it leaves out is what BaseHandler does for every request to serve cases a webhook never
    is (measured in docs/benchmarks.md, "The webhook chain"): the chain of per-layer wrappers
    and coroutine checks, view and template-response middleware, ATOMIC_REQUESTS, running a
    sync view on a thread, and setting the task's URLconf on every request (only an error
    page reads it, and it is set for that). Whatever of these could apply is refused rather
    than skipped silently: a middleware with other hooks or ATOMIC_REQUESTS when the chain is
    built, a sync view when its route is first resolved.
    """

    def __init__(self, *, urlconf: str):
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured
        from django.core.handlers.exception import response_for_exception
        from django.urls import get_resolver, set_urlconf
        from django.utils.log import log_response
        from django.utils.module_loading import import_string

        for alias, database in settings.DATABASES.items():
            if database.get("ATOMIC_REQUESTS"):
                # Django refuses it for a coroutine view too (make_view_atomic).
                raise ImproperlyConfigured(
                    f"DATABASES[{alias!r}] sets ATOMIC_REQUESTS: not for the webhook chain"
                )
        self.urlconf = urlconf
        self._set_urlconf, self._log_response = set_urlconf, log_response
        self._response_for_exception = response_for_exception
        # (process_request, process_response) per middleware, outermost first. Called as
        # hooks, never through the instance: get_response is not part of this chain.
        self.layers: list[tuple[Callable | None, Callable | None]] = []
        for name in settings.MIDDLEWARE:
            if name not in WEBHOOK_MIDDLEWARE:
                continue
            middleware = import_string(name)(_never_called)
            for hook in ("process_view", "process_template_response", "process_exception"):
                if hasattr(middleware, hook):
                    raise ImproperlyConfigured(f"{name} has {hook}: not for the webhook chain")
            self.layers.append(
                (
                    getattr(middleware, "process_request", None),
                    getattr(middleware, "process_response", None),
                )
            )
        resolver = get_resolver(urlconf)

        # A provider POSTs to the same few paths every time: the match is kept per path
        # (matching the URLconf's patterns was a tenth of a webhook's Python). A path that
        # does not resolve raises every time, so only routes are kept, at most 256.
        @lru_cache(maxsize=256)
        def route(path: str):
            match = resolver.resolve(path)
            if not asyncio.iscoroutinefunction(match.func):
                raise ImproperlyConfigured(f"{match.func!r} is not a coroutine view")
            return match

        self.route = route

    async def response(self, request) -> Any:
        """The HttpResponse Django's handler would give this request."""
        response = None
        entered = 0  # layers whose process_request ran without raising
        try:
            for process_request, _ in self.layers:
                if process_request is not None:
                    response = process_request(request)
                entered += 1
                if response is not None:
                    break
            else:
                match = self.route(request.path_info)
                request.resolver_match = match  # as BaseHandler.resolve_request
                # The match is shared between requests: the view gets a copy of its kwargs.
                response = await match.func(request, *match.args, **match.kwargs)
                if response is None:
                    raise ValueError(f"The view {match.func.__qualname__} returned None.")
        except Exception as exc:
            response = await self._converted(request, exc)
        for _, process_response in reversed(self.layers[:entered]):
            if process_response is not None:
                try:
                    response = process_response(request, response)
                except Exception as exc:
                    response = await self._converted(request, exc)
        response._resource_closers.append(request.close)
        if response.status_code >= 400:
            await sync_to_async(self._log_response, thread_sensitive=False)(
                "%s: %s",
                response.reason_phrase,
                request.path,
                response=response,
                request=request,
            )
        return response

    async def _converted(self, request, exc: Exception):
        # An error page is resolved through the request's URLconf, as after Django's
        # resolve_request (the loop's: its handler404/500 are the project's defaults).
        self._set_urlconf(self.urlconf)
        return await sync_to_async(self._response_for_exception, thread_sensitive=False)(
            request, exc
        )


def _never_called(request):  # the get_response a hook-only middleware is built with
    raise RuntimeError("the webhook chain calls its middleware's hooks, not the middleware")


class WebhooksOnTheLoop:
    """Responder for `/webhooks/`: the receive view run by WebhookChain on the server's event
    loop.

    The receive view here is the coroutine one (the request's URLconf is
    ingress/urls_on_the_loop.py), and its row is written by the loop's
    group commit (ingress/store.py, LoopGroupCommit, on `store_connections` asyncio
    connections of this process), so a webhook costs no thread at all: no hop from the loop
    to a thread and back, no lock handed between threads. The request is the WSGIRequest the
    thread path builds (a2wsgi's environ), so the view sees the same META either way.
    """

    def __init__(self, *, store_connections: int):
        # Bound once here, not imported per request (this module imports no Django at import).
        from a2wsgi.wsgi import build_environ
        from django.core import signals
        from django.core.handlers.wsgi import get_script_name
        from django.db import connections
        from django.urls import set_script_prefix

        from ingress.store import raw_rows_on_loop

        self._build_environ, self._signals = build_environ, signals
        self._script_name, self._set_script_prefix = get_script_name, set_script_prefix
        self._store = raw_rows_on_loop
        self._started = _RequestSignal(signals.request_started)
        self._finished = _RequestSignal(signals.request_finished)
        self.chain = WebhookChain(urlconf=WEBHOOK_URLCONF)
        self.store_connections = store_connections
        # On SQLite there are no asyncio connections: the view stores through the threads'
        # group commit (asgiref's sync thread), which serialises writes as SQLite does anyway.
        self.store_on_loop = connections["default"].vendor == "postgresql"
        self.request_class = _webhook_request_class()

    async def respond(self, scope: dict, body: bytes) -> Answer:
        loop = asyncio.get_running_loop()
        if self.store_on_loop and not self._store.serves(loop):
            self._store.serve(loop, max_connections=self.store_connections)
        # a2wsgi's Environ TypedDict does not know the keys WSGI servers add.
        environ: dict[str, Any] = self._build_environ(scope, io.BytesIO(body))  # type: ignore[arg-type,assignment]
        # BufferedBody let the request through with its whole body: one without a
        # Content-Length is complete too (what `wsgi.input_terminated` says under gunicorn).
        environ["wsgi.input_terminated"] = True
        # What WSGIHandler.__call__ does around get_response; the prefix is this task's own
        # (asgiref's Local) and reads "/" unless set, so an empty script name sets nothing.
        script_name = self._script_name(environ)
        if script_name:
            self._set_script_prefix(script_name)
        if self._started.has_work():
            self._signals.request_started.send(sender=self.__class__, environ=environ)
        response = await self.chain.response(self.request_class(environ))
        headers = [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in response.items()
        ]
        if response.cookies:
            headers += [
                (b"set-cookie", cookie.output(header="").strip().encode("latin-1"))
                for cookie in response.cookies.values()
            ]
        content = response.content
        if self._finished.has_work():
            response.close()  # its closers, then request_finished
        else:
            for closer in response._resource_closers:  # what close() runs but the signal
                closer()
            response.closed = True
        return response.status_code, headers, content


# Django's own receivers of request_started / request_finished: per-thread (per asyncio
# context) housekeeping of its database connections, caches and URLconf. On the loop a
# webhook uses none of them (its row goes through the store's own asyncio connection, the
# URLconf is set only for an error page, in the request's own task), so sending the signals
# only to these would spend a tenth of a webhook's CPU (docs/benchmarks.md) on doing nothing.
# Any other receiver (an app's, a monitoring SDK's) makes them be sent as usual.
_HOUSEKEEPING_RECEIVERS = frozenset(
    {
        "django.db.reset_queries",
        "django.db.close_old_connections",
        "django.core.cache.close_caches",
        "django.core.handlers.base.reset_urlconf",
    }
)


class _RequestSignal:
    """Whether a request signal has a receiver beyond Django's housekeeping (re-read when
    its receivers change)."""

    def __init__(self, signal):
        self.signal = signal
        self._seen: tuple | None = None
        self._has_work = True

    def has_work(self) -> bool:
        receivers = self.signal.receivers  # (lookup key, receiver or weakref, is_async)
        keys = tuple(key for key, _receiver, _is_async in receivers)
        if keys != self._seen:
            # Every receiver counts, whatever sender it was connected for.
            self._seen, self._has_work = keys, any(
                _dotted(receiver) not in _HOUSEKEEPING_RECEIVERS
                for _key, receiver, _is_async in receivers
            )
        return self._has_work


def _dotted(receiver) -> str:
    if isinstance(receiver, weakref.ReferenceType):
        receiver = receiver()
        if receiver is None:
            return next(iter(_HOUSEKEEPING_RECEIVERS))  # gone: it will never be called
    return f"{getattr(receiver, '__module__', '')}.{getattr(receiver, '__qualname__', '')}"


def _webhook_request_class() -> type:
    """WSGIRequest for the loop: resolved by the loop's URLconf; its Content-Type parsed, and
    its host checked against ALLOWED_HOSTS, once per distinct header rather than per request
    (a provider sends the same ones every time)."""
    import codecs

    from django.core.handlers.wsgi import WSGIRequest
    from django.core.signals import setting_changed
    from django.utils.http import parse_header_parameters

    # Raw hosts (as _get_raw_host() reads them) that HttpRequest.get_host() accepted. Only
    # accepted ones are kept, at most 64: a client sending ever new Hosts costs a check each,
    # never memory. The verdict depends on settings alone, so it is dropped when they change.
    accepted_hosts: set[str] = set()

    def forget_hosts(*, setting: str, **kwargs: Any) -> None:
        if setting in ("ALLOWED_HOSTS", "DEBUG", "USE_X_FORWARDED_HOST", "USE_X_FORWARDED_PORT"):
            accepted_hosts.clear()

    # Held by the class below, so the receiver lives as long as the class (a weak receiver:
    # tests build many responders, and a strong one would outlive each of them).
    setting_changed.connect(forget_hosts)

    @lru_cache(maxsize=64)
    def parsed(content_type: str) -> tuple[str, tuple[tuple[str, str], ...], str | None]:
        main, params = parse_header_parameters(content_type)
        encoding = params.get("charset")
        if encoding is not None:
            try:
                codecs.lookup(encoding)
            except LookupError:
                encoding = None  # as Django: an unknown charset leaves the default
        return main, tuple(params.items()), encoding

    class WebhookRequest(WSGIRequest):
        # Django resolves a request with a `urlconf` by it: the webhook routes with the
        # coroutine view (the project's URLconf serves the WSGI one).
        urlconf = WEBHOOK_URLCONF
        _forget_hosts = staticmethod(forget_hosts)

        def _set_content_type_params(self, meta):
            # HttpRequest._set_content_type_params, over the cached parse.
            self.content_type, params, encoding = parsed(meta.get("CONTENT_TYPE", ""))
            self.content_params = dict(params)
            if encoding is not None:
                # Not the `encoding` setter: its hasattr() check of the cached GET would
                # build request.GET only to drop it again (nothing has read GET yet; it
                # is built with this encoding when something does).
                self._encoding = encoding

        def get_host(self) -> str:
            # HttpRequest.get_host's verdict, kept: its split and pattern match per request
            # were a twentieth of a webhook's Python (CommonMiddleware asks on every one).
            raw = self._get_raw_host()  # type: ignore[attr-defined]  # (not in the stubs)
            if raw in accepted_hosts:
                return raw
            host = super().get_host()  # raises DisallowedHost
            if len(accepted_hosts) < 64:
                accepted_hosts.add(raw)
            return host

    return WebhookRequest


def application():
    """The ASGI app each server worker builds (uvicorn's factory mode: nothing at import)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventdrop.settings")
    from django.conf import settings
    from django.core.wsgi import get_wsgi_application

    django_app = get_wsgi_application()  # sets Django up: only then may models be imported

    from ingress.sources import all_sources

    def complete_body(wsgi_app):
        def complete_body_wsgi(environ, start_response):
            # BufferedBody let this request through with its whole body: a body without a
            # Content-Length is complete too (what `wsgi.input_terminated` says under
            # gunicorn).
            environ["wsgi.input_terminated"] = True
            return wsgi_app(environ, start_response)

        return complete_body_wsgi

    config = WebServerConfig.from_environ()
    if config.ack_rollup_flush_seconds:
        _start_ack_rollup(config.ack_rollup_flush_seconds)
    largest_source_limit = max(
        (source.max_body_bytes for source in all_sources().values()), default=0
    )
    from ingress.store import raw_rows_on_loop

    return BufferedBody(
        webhooks=WebhooksOnTheLoop(store_connections=config.store_connections),
        rest=DjangoThreads(complete_body(django_app), threads=config.threads),
        timeout_seconds=settings.WEBHOOK_BODY_READ_TIMEOUT_SECONDS,
        max_body_bytes=max(largest_source_limit, settings.DATA_UPLOAD_MAX_MEMORY_SIZE or 0),
        max_in_flight=config.max_concurrent_requests,
        on_shutdown=raw_rows_on_loop.aclose,
    )


def _start_ack_rollup(interval_seconds: float) -> None:
    # One per worker process (uvicorn calls the factory in each): its own histogram's deltas.
    from console.ack_rollup import AckRollup, AckRollupFlusher
    from ingress.views import ACK_SECONDS

    AckRollupFlusher(AckRollup(ACK_SECONDS), interval_seconds=interval_seconds).start()


def _empty_prometheus_multiproc_dir() -> None:
    # prometheus_client's multiprocess mode: the directory must start empty (stale files of
    # an earlier run would be added to this one's figures). No metric of ours is a live
    # gauge, so a worker that exits leaves nothing that needs marking dead.
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)


def serve(config: WebServerConfig | None = None) -> None:
    import uvicorn

    from eventdrop.web_protocol import BoundedHttpToolsProtocol

    config = config or WebServerConfig.from_environ()
    _empty_prometheus_multiproc_dir()
    uvicorn.run(
        "eventdrop.web:application",
        factory=True,
        host=config.host,
        port=config.port,
        workers=config.processes,
        # httptools' parser (C) on uvloop, with the bounds on a request's head that uvicorn
        # lacks (eventdrop/web_protocol.py). One thread per process speaks HTTP and runs
        # the webhook: no hop between threads per request, which was most of what a webhook
        # cost under granian (docs/benchmarks.md, "granian → uvicorn").
        loop="uvloop",
        http=BoundedHttpToolsProtocol,
        ws="none",
        lifespan="on",
        # An idle keep-alive connection is closed after this; behind a load balancer it
        # must outlast the balancer's own idle timeout, or a request races the close.
        timeout_keep_alive=config.keep_alive_seconds,
        # Requests in flight at shutdown finish within their own deadlines (body read,
        # store); this only bounds the wait for them.
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        # The client address is the peer's: X-Forwarded-For is trusted by nobody here.
        proxy_headers=False,
        server_header=False,
        access_log=False,
        # Django's LOGGING (set up by the app in each worker) formats uvicorn's records too.
        log_config=None,
        log_level=os.environ.get("WEB_LOG_LEVEL", "info"),
    )


if __name__ == "__main__":
    serve()
