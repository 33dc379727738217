"""Broken HTTP framing through real servers, over raw sockets (no client library sends it).

Two servers, started once per module against the test database:

- `web`: the production server, the Procfile's `web:` line (tests/support/processes.py).
  The webhook application reads every body whole, within its deadline, before the receive
  core sees it (ingress/asgi.py).
- `gunicorn`: a plain WSGI server that hands the view whatever it read. Through it the
  receive view's own checks are the only defence, so they are proven here too.

The invariant for every case: no 2xx and no row for a body that is not exactly what its
framing declared; an answer, when there is one, is a 4xx with a JSON error body. About 20 s.
"""

import contextlib
import json
import socket
import struct
import time

import pytest
from django.db import connection

from ingress.models import RawEvent
from tests.support.processes import VENV_BIN, Managed, app_env, free_port, start_procfile

pytestmark = pytest.mark.slow

SIGNATURE = b"Stripe-Signature: t=1700000000,v1=00\r\n"
BODY_READ_TIMEOUT_SECONDS = 1.5
HEADER_READ_TIMEOUT_SECONDS = 2
KEEP_ALIVE_SECONDS = 4
SOCKET_TIMEOUT_SECONDS = 10


def _database_url() -> str:
    db = connection.settings_dict
    credentials = f"{db['USER']}:{db['PASSWORD']}" if db.get("PASSWORD") else db["USER"]
    return f"postgres://{credentials}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def _start(kind: str, port: int, log) -> Managed:
    env = app_env(
        _database_url(),
        WEBHOOK_BODY_READ_TIMEOUT_SECONDS=str(BODY_READ_TIMEOUT_SECONDS),
        WEB_HEADER_READ_TIMEOUT_SECONDS=str(HEADER_READ_TIMEOUT_SECONDS),
        WEB_KEEP_ALIVE_SECONDS=str(KEEP_ALIVE_SECONDS),
        WEB_CONCURRENCY="1",
    )
    if kind == "web":
        return start_procfile("web", env, port=port, log=log)
    args = [
        str(VENV_BIN / "gunicorn"),
        "eventdrop.wsgi",
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        "1",
        "--threads",
        "4",
        "--worker-class",
        "gthread",
    ]
    return Managed(args, env, log)


@pytest.fixture(scope="module", params=["web", "gunicorn"])
def server(request, django_db_setup, tmp_path_factory):
    """(kind, port) of a server on the test database; rows it commits are visible here."""
    port = free_port()
    log = tmp_path_factory.mktemp("framing") / f"{request.param}.log"
    process = _start(request.param, port, log)
    try:
        process.wait_listening(port, timeout=30)
        yield request.param, port
    finally:
        process.stop()


def exchange(
    port: int, head: bytes, body: bytes = b"", *, half_close: bool = False, pause: float = 0.0
) -> tuple[int | None, dict | None]:
    """Send `head` (request line and headers, without the blank line) and `body`, maybe
    half-close, and read one response: (status, JSON body), or (None, None) if the server
    closed without answering."""
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        sock.sendall(head + b"\r\n" + body)
        if pause:
            time.sleep(pause)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while b"\r\n\r\n" not in received:
                data = sock.recv(65536)
                if not data:
                    return None, None
                received += data
            header_block, _, rest = received.partition(b"\r\n\r\n")
            lines = header_block.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            length = int({k.lower(): v for k, v in headers.items()}.get("content-length", 0))
            while len(rest) < length:
                data = sock.recv(65536)
                if not data:
                    break
                rest += data
        except ConnectionResetError:
            return None, None
    return status, (json.loads(rest[:length]) if length else None)


def post_head(path: str = "/webhooks/stripe/", *extra: bytes) -> bytes:
    return (
        b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n" + SIGNATURE + b"".join(extra)
    )


def assert_refused(status: int | None, answer: dict | None, *codes: str) -> None:
    """Not acknowledged: closed without an answer, or a 4xx with a JSON error body."""
    if status is None:
        return
    assert 400 <= status < 500, (status, answer)
    assert answer is not None and answer["error"] in codes, answer


@pytest.mark.django_db(transaction=True)
def test_a_whole_body_is_stored(server):
    _, port = server
    body = b'{"id": "evt_framing_ok"}'

    status, answer = exchange(
        port, post_head("/webhooks/stripe/", b"Content-Length: %d\r\n" % len(body)), body
    )

    assert status == 202 and answer is not None, answer
    assert bytes(RawEvent.objects.get(pk=answer["id"]).body) == body


@pytest.mark.django_db(transaction=True)
def test_a_whole_chunked_body_is_stored_byte_exact(server):
    _, port = server
    chunks = [b'{"id": "evt_', bytes(range(256)), b"\r\n0\r\n", b'"}']
    framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"

    status, answer = exchange(
        port, post_head("/webhooks/stripe/", b"Transfer-Encoding: chunked\r\n"), framed
    )

    assert status == 202 and answer is not None, answer
    event = RawEvent.objects.get(pk=answer["id"])
    assert bytes(event.body) == b"".join(chunks)
    assert "transfer-encoding" not in event.headers


@pytest.mark.django_db(transaction=True)
def test_a_body_at_the_source_limit_is_stored_and_one_byte_more_is_413(server):
    _, port = server
    limit = 1024 * 1024  # the default max_body_bytes
    body = bytes(range(256)) * (limit // 256)

    status, answer = exchange(
        port, post_head("/webhooks/stripe/", b"Content-Length: %d\r\n" % limit), body
    )
    assert status == 202 and answer is not None, answer
    assert bytes(RawEvent.objects.get(pk=answer["id"]).body) == body

    status, answer = exchange(
        port, post_head("/webhooks/stripe/", b"Content-Length: %d\r\n" % (limit + 1)), body + b"x"
    )
    assert status == 413 and answer is not None, answer
    assert answer["error"] == "body_too_large"
    assert RawEvent.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_body_shorter_than_its_content_length_is_never_stored(server):
    _, port = server
    status, answer = exchange(
        port,
        post_head("/webhooks/stripe/", b"Content-Length: 500\r\n"),
        b"y" * 102,
        half_close=True,
        pause=0.2,
    )

    assert_refused(status, answer, "truncated_body")
    assert not RawEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_chunk_size_that_is_not_hex_is_400(server):
    _, port = server
    status, answer = exchange(
        port,
        post_head("/webhooks/stripe/", b"Transfer-Encoding: chunked\r\n"),
        b"zz\r\nabc\r\n0\r\n\r\n",
    )

    assert status == 400 and answer is not None, answer
    assert answer["error"] == "malformed_body"
    assert not RawEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_chunked_body_cut_off_mid_chunk_is_never_stored(server):
    _, port = server
    status, answer = exchange(
        port,
        post_head("/webhooks/stripe/", b"Transfer-Encoding: chunked\r\n"),
        b"a\r\nabc",
        half_close=True,
        pause=0.2,
    )

    assert_refused(status, answer, "malformed_body")
    assert not RawEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_neither_content_length_nor_chunked_is_411(server):
    _, port = server
    status, answer = exchange(port, post_head(), b"")

    assert status == 411 and answer is not None, answer
    assert answer["error"] == "length_required"
    assert not RawEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_both_spellings_of_the_url_are_stored(server):
    _, port = server
    for path in ("/webhooks/github/", "/webhooks/github"):
        body = b'{"zen": "%s"}' % path.encode()
        status, answer = exchange(
            port,
            (
                b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"X-Hub-Signature-256: sha256=00\r\nContent-Length: %d\r\n" % len(body)
            ),
            body,
        )

        assert status == 202 and answer is not None, (path, status, answer)
        assert bytes(RawEvent.objects.get(pk=answer["id"]).body) == body


@pytest.mark.django_db(transaction=True)
def test_headers_over_the_source_limit_are_431_without_a_row(server):
    _, port = server
    padding = b"".join(b"X-Pad-%d: %s\r\n" % (n, b"p" * 8000) for n in range(5))  # 40 KB

    status, answer = exchange(
        port, post_head("/webhooks/stripe/", padding, b"Content-Length: 2\r\n"), b"{}"
    )

    assert status == 431 and answer is not None, answer
    assert answer["error"] == "headers_too_large"
    assert not RawEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_rest_of_the_app_is_served_too(server):
    _, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        sock.sendall(
            b"GET /admin/login/?next=/admin/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Connection: close\r\n\r\n"
        )
        received = b""
        while data := sock.recv(65536):
            received += data

    head, _, page = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"set-cookie: csrftoken=" in head.lower()
    assert b'name="next" value="/admin/"' in page


# --- only the production server bounds the time a body may take ----------------------------


@pytest.mark.django_db(transaction=True)
def test_slow_body_is_cut_off_at_the_read_deadline_and_never_stored(server):
    kind, port = server
    if kind != "web":
        pytest.skip("gunicorn has no body read deadline: that is why it is not the Procfile's")
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        sock.sendall(post_head("/webhooks/stripe/", b"Content-Length: 20\r\n") + b"\r\n")
        answer = b""
        for _ in range(20):  # a byte a second would take 20 s
            try:
                sock.sendall(b"x")
            except OSError:
                break
            sock.settimeout(1.0)
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            break

    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b'"body_read_timeout"' in answer
    assert time.monotonic() - started < BODY_READ_TIMEOUT_SECONDS + 3
    assert not RawEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_headers_sent_slowly_are_cut_off_at_the_header_deadline(server):
    kind, port = server
    if kind != "web":
        pytest.skip("WEB_HEADER_READ_TIMEOUT_SECONDS is the production server's setting")
    started = time.monotonic()
    closed = False
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        sock.sendall(b"POST /webhooks/stripe/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.settimeout(0.5)
        for n in range(20):  # a header line every half second: never done
            try:
                sock.sendall(b"X-Slow-%d: x\r\n" % n)
                closed = sock.recv(65536) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
            break

    assert closed
    assert time.monotonic() - started < HEADER_READ_TIMEOUT_SECONDS + 2
    assert not RawEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_chunked_body_that_never_ends_is_408_and_never_stored(server):
    kind, port = server
    if kind != "web":
        pytest.skip("gunicorn has no body read deadline: that is why it is not the Procfile's")
    status, answer = exchange(
        port,
        post_head("/webhooks/stripe/", b"Transfer-Encoding: chunked\r\n"),
        b"5\r\nabcde\r\n",  # and then nothing, with the connection open
    )

    assert status == 408 and answer is not None, answer
    assert answer["error"] == "body_read_timeout"
    assert not RawEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_server_bounds_headers_before_any_source_does(server):
    kind, port = server
    if kind != "web":
        pytest.skip("gunicorn's limits are per field (8190 bytes x 100 fields)")
    padding = b"".join(b"X-Pad-%d: %s\r\n" % (n, b"p" * 8000) for n in range(95))  # 761 KB

    status, _ = exchange(
        port, post_head("/webhooks/stripe/", padding, b"Content-Length: 2\r\n"), b"{}"
    )

    assert status == 431
    assert not RawEvent.objects.exists()


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `sock` (reading nothing), or None if it did not."""
    started = time.monotonic()
    sock.settimeout(0.25)
    while time.monotonic() - started < seconds:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - started
    return None


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (head and its Content-Length of body), or what came before EOF."""
    received = b""
    while b"\r\n\r\n" not in received:
        data = sock.recv(65536)
        if not data:
            return received
        received += data
    head, _, rest = received.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(rest) < length:
        data = sock.recv(65536)
        if not data:
            break
        rest += data
    return head + b"\r\n\r\n" + rest


@pytest.mark.django_db(transaction=True)
def test_a_connection_that_sends_nothing_is_closed_at_the_header_deadline(server):
    kind, port = server
    if kind != "web":
        pytest.skip("WEB_HEADER_READ_TIMEOUT_SECONDS is the production server's setting")
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        closed_after = _closed_within(sock, HEADER_READ_TIMEOUT_SECONDS + 3)

    assert closed_after is not None, "an idle new connection was kept open"
    assert HEADER_READ_TIMEOUT_SECONDS - 0.5 < closed_after < HEADER_READ_TIMEOUT_SECONDS + 2


@pytest.mark.django_db(transaction=True)
def test_an_idle_keep_alive_connection_is_served_then_closed_at_the_header_deadline(server):
    # granian's header read timeout also bounds the wait for a connection's next request:
    # an idle keep-alive connection lasts the header deadline (no separate keep-alive
    # setting exists among its options).
    kind, port = server
    if kind != "web":
        pytest.skip("WEB_HEADER_READ_TIMEOUT_SECONDS is the production server's setting")
    body = b'{"id": "evt_keep_alive"}'
    request = post_head("/webhooks/stripe/", b"Content-Length: %d\r\n" % len(body))
    request += b"\r\n" + body
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        sock.sendall(request)
        assert _read_response(sock).startswith(b"HTTP/1.1 202")
        # Idle inside the header deadline: still open, still served.
        time.sleep(HEADER_READ_TIMEOUT_SECONDS / 2)
        sock.sendall(request)
        assert _read_response(sock).startswith(b"HTTP/1.1 202")
        closed_after = _closed_within(sock, HEADER_READ_TIMEOUT_SECONDS + 3)

    assert closed_after is not None, "an idle keep-alive connection was kept open"
    assert HEADER_READ_TIMEOUT_SECONDS - 0.5 < closed_after < HEADER_READ_TIMEOUT_SECONDS + 2
    assert RawEvent.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_header_line_that_never_ends_is_431_before_the_server_buffers_it(server):
    kind, port = server
    if kind != "web":
        pytest.skip("gunicorn's limits are per field (8190 bytes x 100 fields)")
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        sock.sendall(post_head("/webhooks/stripe/") + b"X-Endless: ")
        answer = b""
        try:
            for _ in range(64):  # 64 x 16 KiB, far past the server's 64 KiB, never a CRLF
                sock.sendall(b"e" * 16384)
        except OSError:
            pass  # closed by the server: the answer was sent before
        sock.settimeout(SOCKET_TIMEOUT_SECONDS)
        with contextlib.suppress(OSError):
            answer = _read_response(sock)

    # The server's own answer (its body is empty: it is given before any application code).
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert not RawEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_head_limit_is_per_request_on_a_long_keep_alive_connection(server):
    # 100 requests of ~1 KiB heads on one connection, each head in two reads: 100 KiB of
    # heads in all, past the server's 64 KiB. Each is its own head, within the limit.
    kind, port = server
    if kind != "web":
        pytest.skip("gunicorn's limits are per field (8190 bytes x 100 fields)")
    body = b'{"id": "evt_long_connection"}'
    padding = b"X-Pad: " + b"p" * 800 + b"\r\n"
    request = post_head("/webhooks/stripe/", padding, b"Content-Length: %d\r\n" % len(body))
    answers = []
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(100):
            sock.sendall(request[:40])
            time.sleep(0.01)  # the rest of the head in a read of its own
            sock.sendall(request[40:] + b"\r\n" + body)
            answers.append(_read_response(sock)[:12])

    assert answers == [b"HTTP/1.1 202"] * 100
    assert RawEvent.objects.count() == 100


@pytest.mark.django_db(transaction=True)
def test_a_malformed_request_line_is_a_400(server):
    kind, port = server
    if kind != "web":
        pytest.skip("gunicorn answers its own HTML error page")
    # The first the server's parser refuses (its own answer, empty-bodied); the second it
    # parses (the authority of an absolute target is not the Host), and the Host check
    # refuses it.
    for head, code in (
        (b"POST /webhooks/stripe/ HTTP/1.1 extra\r\nHost: x\r\n", None),
        (b"POST http://a:99999/webhooks/stripe/ HTTP/1.1\r\nHost: x\r\n", "disallowed_host"),
    ):
        status, answer = exchange(port, head)

        assert status == 400, (head, answer)
        assert (answer and answer["error"]) == code, (head, answer)
    assert not RawEvent.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_past_the_webhooks_in_progress_503_at_once_past_the_connections_wait_unread(tmp_path):
    """The two per-process caps on the real server (one process, 2 connections, 1 webhook in
    progress). A client trickling its body holds the one webhook place: a whole webhook sent
    meanwhile is answered 503 + Retry-After at once, before the trickler's 408. Then two
    connections that send nothing hold both of granian's places (its backpressure): a third
    waits in the listen queue, unread, until they are closed at the header deadline, and is
    then served."""
    port = free_port()
    env = app_env(
        _database_url(),
        WEBHOOK_BODY_READ_TIMEOUT_SECONDS=str(BODY_READ_TIMEOUT_SECONDS),
        WEB_HEADER_READ_TIMEOUT_SECONDS=str(HEADER_READ_TIMEOUT_SECONDS),
        WEB_CONCURRENCY="1",
        WEB_MAX_CONNECTIONS="2",
        WEB_MAX_CONCURRENT_REQUESTS="1",
    )
    body = b'{"id": "evt_waits_its_turn"}'
    request = post_head("/webhooks/stripe/", b"Content-Length: %d\r\n" % len(body))
    request += b"\r\n" + body
    process = start_procfile("web", env, port=port, log=tmp_path / "web.log")
    try:
        process.wait_listening(port, timeout=30)
        with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as slow:
            slow.sendall(post_head("/webhooks/stripe/", b"Content-Length: 50\r\n") + b"\r\nx")
            _wait_read_by_server(port, slow)  # its request is in flight, its body incomplete
            with socket.create_connection(
                ("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS
            ) as second:
                second.sendall(request)
                refused = _read_response(second)
            slow.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                assert slow.recv(65536) == b"", "the trickler was answered first"
            slow.settimeout(SOCKET_TIMEOUT_SECONDS)
            assert _read_response(slow).startswith(b"HTTP/1.1 408")

        idle = [
            socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS)
            for _ in range(2)
        ]
        opened = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as third:
            third.sendall(request)
            served = _read_response(third)
        waited = time.monotonic() - opened
        for sock in idle:
            sock.close()
    finally:
        process.stop()

    assert refused.startswith(b"HTTP/1.1 503"), refused
    assert b"retry-after: " in refused.lower() and b'"error": "busy"' in refused
    assert served.startswith(b"HTTP/1.1 202"), served
    assert waited > HEADER_READ_TIMEOUT_SECONDS - 0.5, waited  # until the idle ones closed
    assert [bytes(event.body) for event in RawEvent.objects.all()] == [body]


# --- how answers leave the production server -----------------------------------------------


def _wait_read_by_server(port: int, client: socket.socket, seconds: float = 30) -> None:
    """Until the server has read every byte `client` sent: the receive queue of the server's
    end of the connection (Linux's /proc/net/tcp, local port `port`) is empty."""
    peer = client.getsockname()[1]
    deadline = time.monotonic() + seconds
    while True:
        unread = None
        with open("/proc/net/tcp") as table:
            for line in list(table)[1:]:
                fields = line.split()
                if (int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)) == (
                    port,
                    peer,
                ):
                    unread = int(fields[4].split(":")[1], 16)
        if unread == 0:
            return
        assert time.monotonic() < deadline, (
            f"waited {seconds} s for the server to read what the client sent; {unread} bytes "
            "still unread"
        )
        time.sleep(0.01)


def _data_segments_received(sock: socket.socket) -> int:
    """Linux's count of segments with data that arrived on this connection (TCP_INFO's
    tcpi_data_segs_in, at a fixed offset of struct tcp_info since Linux 4.6)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return struct.unpack_from("I", info, 152)[0]


@pytest.mark.django_db(transaction=True)
def test_an_answer_leaves_in_one_segment(server):
    """The head and the body of an answer go out in one segment (one wake-up of the client
    per answer), from the webhook application and from Django's own handler alike."""
    kind, port = server
    if kind != "web":
        pytest.skip("how the production server writes")
    body = b'{"id": "evt_one_segment"}'
    webhook = post_head("/webhooks/stripe/", b"Content-Length: %d\r\n" % len(body))
    requests = [webhook + b"\r\n" + body, b"GET /admin/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"]
    segments = []
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        for request in requests * 2:
            before = _data_segments_received(sock)
            sock.sendall(request)
            answer = _read_response(sock)
            assert answer.startswith((b"HTTP/1.1 202", b"HTTP/1.1 200")), answer[:80]
            segments.append(_data_segments_received(sock) - before)

    assert segments == [1, 1, 1, 1]


@pytest.mark.django_db(transaction=True)
def test_100_continue_is_sent_while_the_client_waits_with_its_body(server):
    """A client that asks `Expect: 100-continue` sends its body only once told to: the
    interim answer must leave at once, not wait to be joined to the final one."""
    kind, port = server
    if kind != "web":
        pytest.skip("how the production server writes")
    body = b'{"id": "evt_continue"}'
    head = post_head(
        "/webhooks/stripe/", b"Content-Length: %d\r\n" % len(body), b"Expect: 100-continue\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS) as sock:
        sock.sendall(head + b"\r\n")
        sock.settimeout(BODY_READ_TIMEOUT_SECONDS / 2)  # well inside the body's deadline
        interim = sock.recv(65536)
        sock.settimeout(SOCKET_TIMEOUT_SECONDS)
        sock.sendall(body)
        answer = _read_response(sock)

    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert answer.startswith(b"HTTP/1.1 202"), answer[:80]
    assert [bytes(event.body) for event in RawEvent.objects.all()] == [body]
