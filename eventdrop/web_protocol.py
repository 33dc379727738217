"""uvicorn's HTTP/1.1 protocol (httptools) with the two bounds on a request's head it lacks,
and each answer sent in one write (`_WritesJoinedPerTurn`).

uvicorn bounds a keep-alive connection's idle time and nothing before a request's body: a
client may take forever to send its request line and headers, one byte at a time (the
slowloris attack), and httptools buffers a header of any length until its line ends. The
production server (eventdrop/web.py) closes both doors, per connection:

- the **head deadline** (`WEB_HEADER_READ_TIMEOUT_SECONDS`): from the moment a connection is
  made, and again from the first byte of each later request on it, the request line and
  headers must be complete within the deadline, or the connection is closed unanswered (an
  idle keep-alive connection is uvicorn's `timeout_keep_alive`, `WEB_KEEP_ALIVE_SECONDS`);
- the **head size** (`WEB_MAX_HEADER_BYTES`): a head larger than that is answered 431 and
  the connection closed, before any of it reaches the app; while a head is incomplete the
  bytes received for it are counted, so at most the limit plus one read is ever buffered.

Bodies are bounded by the app itself (eventdrop/web.py's BufferedBody: a deadline and a cap
for the whole body), and the receive view bounds each source's headers lower still.

Bound to uvicorn's internals (HttpToolsProtocol's callbacks and attributes): pyproject.toml
pins uvicorn's minor version, and tests/ingress/test_receive_framing.py drives both bounds
through the real server.
"""

import asyncio
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from eventdrop.web import WebServerConfig, json_answer

# The request line's fixed part around the URL: "POST " and " HTTP/1.1\r\n", at most.
_REQUEST_LINE_OVERHEAD = len("OPTIONS  HTTP/1.1\r\n")


class _HeadTooLarge(Exception):
    pass


class _WritesJoinedPerTurn:
    """The connection's transport, with the writes of one event-loop turn sent as one.

    uvicorn writes a response's head and its body separately, and uvloop sends each at once:
    two send() calls, two segments on the wire and two wake-ups of the client for every
    answer, where the loopback's delivery to the client runs inside each call (the first
    write was 12.5 % of the web processes' GIL samples, the second 6 %; docs/benchmarks.md).
    Here a write is held for the rest of the loop turn it was made in (sent by a call_soon
    callback) and joined to the writes after it, so a response that is sent whole
    (BufferedBody always sends one) leaves in one send(): 0.89 of the server's CPU per
    webhook. Nothing waits past the turn, so a 100 Continue or a streamed chunk still goes
    out at once. Every write of the connection, the protocol's own answers too, goes
    through here, so their order on the wire is the order they were made in; close() sends
    what is held first, abort() drops it, as the transport would.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self._send_held)
        self._held.append(data)

    def writelines(self, chunks: Iterable[bytes]) -> None:
        for chunk in chunks:
            self.write(chunk)

    def _send_held(self) -> None:
        held, self._held = self._held, []
        # A transport closed meanwhile (the client left; not through close() here, which
        # sends first) takes no more writes: uvloop would raise in this callback, where
        # nobody catches it, instead of in the response's send().
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._send_held()
        self._transport.close()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a deadline and a size limit for each request's head."""

    # Read once per process from the environment (WebServerConfig): uvicorn builds one
    # protocol per connection, in worker processes that import this module afresh.
    header_read_timeout_seconds: ClassVar[float | None] = None
    max_header_bytes: ClassVar[int] = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cls = type(self)
        if cls.header_read_timeout_seconds is None:
            limits = WebServerConfig.from_environ()
            cls.max_header_bytes = limits.max_header_bytes
            cls.header_read_timeout_seconds = limits.header_read_timeout_seconds
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_complete = False
        self._head_bytes = 0  # received while the head is incomplete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_WritesJoinedPerTurn(transport, self.loop))  # type: ignore[arg-type]
        self._arm_head_deadline()  # a connection that sends nothing is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's data_received, with the head counted and refused. Websocket upgrades
        # are off (ws="none"), so an Upgrade header is answered as a plain request.
        self._unset_keepalive_if_required()
        if not self._head_complete:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._refuse_head()
                return
            self._bad_request()
            return
        except httptools.HttpParserError:
            self._bad_request()
            return
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()
        if not self._head_complete and self._head_bytes > self.max_header_bytes:
            self._refuse_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # Each request's head is counted from here (the read it began in is not: one read
        # more than the limit at most), never the heads before it on the same connection.
        self._head_complete = False
        self._head_bytes = 0
        self._arm_head_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_head_deadline()
        # The head as received, give or take a header's surrounding whitespace: what the
        # parser kept of it. (The count of bytes received cannot tell where in the last read
        # the head ended.)
        size = _REQUEST_LINE_OVERHEAD + len(self.url) + 2
        for name, value in self.headers:
            size += len(name) + len(value) + 4
        if size > self.max_header_bytes:
            raise _HeadTooLarge  # stops the parser; data_received answers 431
        super().on_headers_complete()  # may raise too: a request-target it cannot parse
        self._head_complete = True

    # --- the bounds ----------------------------------------------------------------------

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is None:
            self._head_deadline = self.loop.call_later(
                self.header_read_timeout_seconds or 0, self._head_deadline_passed
            )

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_deadline_passed(self) -> None:
        self._head_deadline = None
        if not self._head_complete and not self.transport.is_closing():
            self.transport.close()  # unanswered: the client has not asked anything yet

    def _refuse_head(self) -> None:
        self._disarm_head_deadline()
        self._answer_and_close(
            431,
            "headers_too_large",
            f"The request's headers exceed the server's limit of {self.max_header_bytes} bytes.",
        )

    def _bad_request(self) -> None:
        # uvicorn answers text; every answer of ours is JSON with a code. In a body (broken
        # chunked framing) the request's app is still waiting for the rest: it is told the
        # client is gone (connection_lost), so the body never reaches the view.
        if self._head_complete:
            self._answer_and_close(400, "malformed_body", "The chunked body is malformed.")
        else:
            self._answer_and_close(
                400, "malformed_request", "The request line or a header is malformed."
            )

    def _answer_and_close(self, status: int, code: str, message: str) -> None:
        """Answer from the protocol itself, then close: the app has not answered this
        request (it never saw it, or waits for a body that will not come)."""
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started and not (
            self.cycle.response_complete
        ):
            self.transport.close()  # the app's answer is half sent: nothing more can be
            return
        _, headers, body = json_answer(status, code, message)
        head = [b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())]
        head += [name + b": " + value + b"\r\n" for name, value in headers]
        self.transport.write(b"".join(head) + b"\r\n" + body)
        self.transport.close()
