"""The receive path at its edges: no database, chunked bodies, missing lengths.

No mocking of the ORM: an unavailable database is made unreachable for real, and request
bodies are fed through WSGI input streams the way a server (gunicorn) hands them over.
"""

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from ingress.models import RawEvent
from ingress.sources import get_source

STRIPE_HEADERS: dict[str, Any] = {"HTTP_STRIPE_SIGNATURE": "t=1700000000,v1=deadbeef"}
READ_CHUNK = 64 * 1024  # what the view asks the stream for at a time


class CountingStream:
    """A wsgi.input serving `total` bytes of `pattern` in pieces of at most `piece` bytes,
    counting how many bytes anybody has read from it."""

    def __init__(self, pattern: bytes, total: int, piece: int = 1000):
        self.pattern, self.total, self.piece = pattern, total, piece
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        left = self.total - self.consumed
        count = min(left, self.piece if size is None or size < 0 else min(size, self.piece))
        piece = self._slice(self.consumed, count)
        self.consumed += count
        return piece

    readline = read  # the WSGI input API; Django wraps both

    def _slice(self, start: int, count: int) -> bytes:
        offset = start % len(self.pattern)
        repeats = (offset + count) // len(self.pattern) + 1
        return (self.pattern * repeats)[offset : offset + count]

    def expected(self) -> bytes:
        return self._slice(0, self.total)


def post_stream(client, stream, *, terminated: bool = True, **extra):
    """POST with no Content-Length: the body is only in the WSGI input stream."""
    environ = {
        "wsgi.input": stream,
        "CONTENT_TYPE": "application/json",
        "HTTP_TRANSFER_ENCODING": "chunked",
        **extra,
    }
    if terminated:
        # A server that de-chunked the body says so (gunicorn always sets it).
        environ["wsgi.input_terminated"] = True
    return client.generic("POST", "/webhooks/stripe/", b"", **environ)


def stripe_limit() -> int:
    source = get_source("stripe")
    assert source is not None
    return source.max_body_bytes


# --- database unavailable ------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def database_unreachable(transactional_db):
    """Point the connection at a port where nothing listens. Yields the way back, which
    also runs at teardown (the flush after a transactional test needs the database)."""
    saved = {key: connection.settings_dict[key] for key in ("HOST", "PORT")}

    def restore() -> None:
        connection.close()
        connection.settings_dict.update(saved)

    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(_closed_port()))
    try:
        yield restore
    finally:
        restore()


def test_unreachable_database_is_503_with_retry_after(client, database_unreachable, caplog):
    body = b'{"id": "evt_secret_payload"}'
    response = client.generic(
        "POST", "/webhooks/stripe/", body, content_type="application/json", **STRIPE_HEADERS
    )

    assert response.status_code == 503
    assert response["Retry-After"] == str(settings.INGRESS_UNAVAILABLE_RETRY_AFTER)
    assert response.json()["error"] == "store_unavailable"
    assert "ingress.receive.store_failed" in caplog.messages
    assert "evt_secret_payload" not in caplog.text  # never log payloads


def test_nothing_was_stored_while_the_database_was_unreachable(client, database_unreachable):
    response = client.generic(
        "POST", "/webhooks/stripe/", b"{}", content_type="application/json", **STRIPE_HEADERS
    )
    assert response.status_code == 503

    database_unreachable()  # back to the real database: nothing was stored
    assert not RawEvent.objects.exists()


# A connection the server ended between two requests is replaced before the INSERT, and
# one that breaks under it is retried once: tests/eventdrop/test_db_bounds.py.


# --- bodies without Content-Length ---------------------------------------------------------


@pytest.mark.django_db
def test_chunked_body_is_stored_byte_exact(client):
    stream = CountingStream(bytes(range(256)), total=200_003, piece=4093)

    response = post_stream(client, stream, **STRIPE_HEADERS)

    assert response.status_code == 202
    event = RawEvent.objects.get(pk=response.json()["id"])
    assert bytes(event.body) == stream.expected()
    assert "content-length" not in event.headers


@pytest.mark.django_db
def test_chunked_body_exactly_at_the_limit_is_accepted(client):
    stream = CountingStream(b"x", total=stripe_limit(), piece=READ_CHUNK)

    response = post_stream(client, stream, **STRIPE_HEADERS)

    assert response.status_code == 202
    assert len(bytes(RawEvent.objects.get().body)) == stripe_limit()


@pytest.mark.django_db
def test_oversized_chunked_body_is_413_and_never_read_whole(client):
    stream = CountingStream(b"x", total=16 * stripe_limit(), piece=READ_CHUNK)

    response = post_stream(client, stream, **STRIPE_HEADERS)

    assert response.status_code == 413
    assert response.json()["error"] == "body_too_large"
    # It stopped within one read of the limit, not at the end of the 16 MiB.
    assert stripe_limit() < stream.consumed <= stripe_limit() + READ_CHUNK
    assert not RawEvent.objects.exists()


@pytest.mark.django_db
def test_one_byte_over_the_limit_chunked_is_413(client):
    stream = CountingStream(b"x", total=stripe_limit() + 1, piece=READ_CHUNK)

    response = post_stream(client, stream, **STRIPE_HEADERS)

    assert response.status_code == 413
    assert not RawEvent.objects.exists()


@pytest.mark.django_db
def test_no_content_length_and_no_terminated_input_is_411(client):
    stream = CountingStream(b"{}", total=2)

    response = post_stream(client, stream, terminated=False, **STRIPE_HEADERS)

    assert response.status_code == 411
    assert response.json()["error"] == "length_required"
    assert stream.consumed == 0
    assert not RawEvent.objects.exists()


@pytest.mark.django_db
def test_empty_content_length_with_terminated_input_reads_the_stream(client):
    # Some WSGI servers put an empty CONTENT_LENGTH in the environ instead of leaving it out.
    stream = CountingStream(b'{"id": "evt_chunked"}', total=21)

    response = post_stream(client, stream, CONTENT_LENGTH="", **STRIPE_HEADERS)

    assert response.status_code == 202
    assert bytes(RawEvent.objects.get().body) == b'{"id": "evt_chunked"}'


@pytest.mark.django_db
def test_missing_signature_on_a_chunked_body_is_400_before_reading(client):
    stream = CountingStream(b"x", total=10_000)

    response = post_stream(client, stream)

    assert response.status_code == 400
    assert response.json()["error"] == "missing_signature"
    assert stream.consumed == 0
    assert not RawEvent.objects.exists()


# --- the same through a real server ---------------------------------------------------------

GUNICORN_LIMIT = 4096


def _wait_until_listening(server: subprocess.Popen, port: int) -> None:
    assert server.stderr is not None  # started with stderr=PIPE
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert server.poll() is None, server.stderr.read().decode(errors="replace")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("gunicorn did not start listening")


@pytest.fixture
def gunicorn_port(transactional_db):
    """gunicorn serving the app against the test database (committed rows are shared)."""
    db = connection.settings_dict
    credentials = f"{db['USER']}:{db['PASSWORD']}" if db.get("PASSWORD") else db["USER"]
    port = _closed_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "eventdrop.settings_test",
        "DATABASE_URL": f"postgres://{credentials}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "WEBHOOK_STRIPE_MAX_BODY_BYTES": str(GUNICORN_LIMIT),
    }
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "eventdrop.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=settings.BASE_DIR,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_until_listening(server, port)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=15)
        if server.stderr:
            server.stderr.close()


def _post_chunked(port: int, chunks: list[bytes]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(
        "POST",
        "/webhooks/stripe/",
        body=iter(chunks),  # an iterable and no length: http.client sends it chunked
        headers={"Content-Type": "application/json", "Stripe-Signature": "t=1,v1=00"},
        encode_chunked=True,
    )
    response = conn.getresponse()
    status, body = response.status, response.read()
    conn.close()
    return status, body


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_chunked_request_through_gunicorn_is_stored_byte_exact(gunicorn_port):
    chunks = [b'{"id": "evt_', bytes(range(256)), b"\r\n0\r\n", b'"}']

    status, body = _post_chunked(gunicorn_port, chunks)

    assert status == 202, body
    event = RawEvent.objects.get(pk=json.loads(body)["id"])
    assert bytes(event.body) == b"".join(chunks)
    assert "transfer-encoding" not in event.headers


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_oversized_chunked_request_through_gunicorn_is_413(gunicorn_port):
    status, body = _post_chunked(gunicorn_port, [b"x" * 1024] * (GUNICORN_LIMIT // 1024 + 1))

    assert status == 413
    assert json.loads(body)["error"] == "body_too_large"
    assert not RawEvent.objects.exists()
