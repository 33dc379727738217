"""The receive contract, through both adapters of the one receive core (ingress/receive.py).

- `django`: the Django view, through Django's test client (a Django-only
  deployment); its row is written by the ORM.
- `asgi`: the ASGI application the production server mounts at /webhooks/ (ingress/asgi.py),
  called as a server calls it; its row is written on its own asyncio connections.

Each case is one request and what the provider is told; rows are read back from the real
database. The server-level bounds (head deadline and size, in-flight cap) are driven through
the real server in tests/ingress/test_receive_framing.py.
"""

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from ingress.asgi import WebhookApp
from ingress.models import RawEvent
from tests.ingress.verifiers.signing import slack_headers

pytestmark = pytest.mark.django_db(transaction=True)

SIGNED = {"Stripe-Signature": "t=1700000000,v1=deadbeef", "Content-Type": "application/json"}
Reply = tuple[int, dict[str, str], bytes]


def via_django(path: str, headers: dict[str, str], body: bytes, method: str = "POST") -> Reply:
    extra: dict[str, Any] = {}
    for name, value in headers.items():
        key = name.upper().replace("-", "_")
        extra[key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"] = value
    response = Client().generic(method, path, body, **extra)
    return response.status_code, {k.lower(): v for k, v in response.items()}, response.content


def call_asgi(app: WebhookApp, scope: dict, receive) -> Reply:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def call() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await app.writer.aclose()

    asyncio.run(call())
    start, answer = sent
    headers = {name.decode(): value.decode() for name, value in start["headers"]}
    return start["status"], headers, answer["body"]


def asgi_scope(path: str, headers: dict[str, str], method: str = "POST") -> dict:
    fields = {"host": "testserver", **{name.lower(): value for name, value in headers.items()}}
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(name.encode(), value.encode("latin-1")) for name, value in fields.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }


def webhook_app(**limits: Any) -> WebhookApp:
    return WebhookApp(
        **{
            "header_read_timeout_seconds": 1,
            "max_requests": 8,
            "max_body_bytes": 4 * 2**20,
            "store_connections": 1,
            **limits,
        }
    )


def via_asgi(path: str, headers: dict[str, str], body: bytes, method: str = "POST") -> Reply:
    headers = {"Content-Length": str(len(body)), **headers}

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    return call_asgi(webhook_app(), asgi_scope(path, headers, method), receive)


@pytest.fixture(params=["django", "asgi"])
def send(request) -> Callable[..., Reply]:
    return via_django if request.param == "django" else via_asgi


def test_a_webhook_is_stored_byte_exact_and_answered_with_its_id(send):
    body = bytes(range(256)) * 3  # not UTF-8: stored byte for byte
    headers = {**SIGNED, "Content-Type": "application/octet-stream", "Cookie": "a=b"}

    status, answer_headers, answer = send("/webhooks/stripe/", headers, body)

    assert status == 202, answer
    event = RawEvent.objects.get()
    assert answer == json.dumps({"id": event.pk, "status": "accepted"}).encode()
    assert answer_headers["content-type"] == "application/json"
    assert bytes(event.body) == body
    assert (event.source, event.method, event.path) == ("stripe", "POST", "/webhooks/stripe/")
    assert event.headers["stripe-signature"] == SIGNED["Stripe-Signature"]
    assert "cookie" not in event.headers
    assert event.remote_addr == "127.0.0.1"


@pytest.mark.parametrize(
    ("path", "method", "headers", "status", "code"),
    [
        ("/webhooks/nope/", "POST", SIGNED, 404, "unknown_source"),
        ("/webhooks/stripe/", "GET", SIGNED, 405, "method_not_allowed"),
        (
            "/webhooks/stripe/",
            "POST",
            {"Content-Type": "application/json"},
            400,
            "missing_signature",
        ),
        ("/webhooks/stripe/", "POST", {**SIGNED, "X-Pad": "p" * 40_000}, 431, "headers_too_large"),
        (
            "/webhooks/stripe/",
            "POST",
            {**SIGNED, "Content-Length": "ten"},
            400,
            "bad_content_length",
        ),
        (
            "/webhooks/stripe/",
            "POST",
            {**SIGNED, "Content-Length": str(1024 * 1024 + 1)},
            413,
            "body_too_large",
        ),
    ],
)
def test_refusals_are_json_errors_without_a_row(send, path, method, headers, status, code):
    got, answer_headers, answer = send(path, headers, b"{}", method)

    assert got == status, answer
    assert json.loads(answer)["error"] == code
    if status == 405:
        assert answer_headers["allow"] == "POST"
    assert not RawEvent.objects.exists()


def test_slacks_handshake_is_answered_once_its_signature_checks_out(send):
    body = json.dumps({"token": "t", "challenge": "3eZbrw1aBm2rZ", "type": "url_verification"})
    signed = slack_headers(body.encode(), os.environ["SLACK_SIGNING_SECRET"], int(time.time()))

    status, _, answer = send("/webhooks/slack/", signed, body.encode())
    assert (status, json.loads(answer)) == (200, {"challenge": "3eZbrw1aBm2rZ"})

    forged = {**signed, "x-slack-signature": "v0=" + "0" * 64}
    status, _, answer = send("/webhooks/slack/", forged, body.encode())
    assert status == 202, answer  # stored for the inbox to reject; no challenge answered
    assert RawEvent.objects.count() == 2


@pytest.fixture
def database_refuses(transactional_db):
    """The connection settings point where nothing listens (the Django view's connection
    and the ASGI adapter's, which opens its own from the same settings)."""
    saved = {key: connection.settings_dict[key] for key in ("HOST", "PORT")}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    connection.close()
    connection.settings_dict.update(HOST="127.0.0.1", PORT=str(closed))
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict.update(saved)


def test_an_unavailable_store_is_503_with_retry_after(send, database_refuses, caplog):
    status, headers, answer = send("/webhooks/stripe/", SIGNED, b'{"id": "evt_secret"}')

    assert status == 503, answer
    assert headers["retry-after"] == str(settings.INGRESS_UNAVAILABLE_RETRY_AFTER)
    assert json.loads(answer)["error"] == "store_unavailable"
    assert "evt_secret" not in caplog.text  # never log payloads


# --- what only the ASGI adapter does (the Django view leaves it to Django and its server) ---


def test_a_host_not_allowed_is_400(settings):
    settings.ALLOWED_HOSTS = ["hooks.example"]
    status, _, answer = via_asgi("/webhooks/stripe/", SIGNED, b"{}")

    assert (status, json.loads(answer)["error"]) == (400, "disallowed_host")
    settings.ALLOWED_HOSTS = [".example"]
    assert via_asgi("/webhooks/stripe/", {**SIGNED, "Host": "hooks.example:8443"}, b"{}")[0] == 202


def test_no_length_and_not_chunked_is_411():
    scope = asgi_scope("/webhooks/stripe/", SIGNED)

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    status, _, answer = call_asgi(webhook_app(), scope, receive)
    assert (status, json.loads(answer)["error"]) == (411, "length_required")


def test_a_body_past_the_source_limit_is_413_and_read_no_further():
    # What a request may hold in memory is its source's limit and one chunk more.
    limit = 1024 * 1024
    chunk = b"x" * 65536
    consumed = 0

    async def receive() -> dict:
        nonlocal consumed
        consumed += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}  # never ends

    scope = asgi_scope("/webhooks/stripe/", {**SIGNED, "Transfer-Encoding": "chunked"})
    status, _, answer = call_asgi(webhook_app(), scope, receive)

    assert (status, json.loads(answer)["error"]) == (413, "body_too_large")
    assert limit < consumed <= limit + len(chunk)
    assert not RawEvent.objects.exists()


def test_a_client_gone_before_the_end_of_its_body_is_never_stored():
    messages: Iterator[dict] = iter(
        [
            {"type": "http.request", "body": b"y" * 10, "more_body": True},
            {"type": "http.disconnect"},
        ]
    )

    async def receive() -> dict:
        return next(messages)

    scope = asgi_scope("/webhooks/stripe/", {**SIGNED, "Content-Length": "500"})
    status, _, answer = call_asgi(webhook_app(), scope, receive)

    assert json.loads(answer) == {
        "error": "truncated_body",
        "message": "The body ended after 10 of the 500 bytes declared.",
    }
    assert status == 400 and not RawEvent.objects.exists()


def test_a_body_that_never_comes_is_408(settings):
    async def receive() -> dict:
        await asyncio.Event().wait()  # the client sends nothing more
        raise AssertionError("unreachable")

    settings.WEBHOOK_BODY_READ_TIMEOUT_SECONDS = 0.2
    scope = asgi_scope("/webhooks/stripe/", {**SIGNED, "Content-Length": "2"})
    status, _, answer = call_asgi(webhook_app(), scope, receive)

    assert (status, json.loads(answer)["error"]) == (408, "body_read_timeout")


def test_paths_under_webhooks_that_name_no_route_are_404():
    for path in ("/webhooks/", "/webhooks/stripe/x/", "/webhooks/st ripe/"):
        status, _, answer = via_asgi(path, SIGNED, b"{}")
        assert status == 404, (path, answer)
    status, _, _ = via_asgi("/webhooks/stripe", SIGNED, b"{}")  # no slash: stored too
    assert status == 202


# --- the request's clock and the process's caps (ingress/asgi.py) ---------------------------


@pytest.fixture
def database_silent(transactional_db):
    """The connection settings point at a listener that accepts and never answers (a frozen
    server: the kernel completes the handshake, nobody reads)."""
    saved = {key: connection.settings_dict[key] for key in ("HOST", "PORT")}
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        connection.close()
        connection.settings_dict.update(HOST="127.0.0.1", PORT=str(silent.getsockname()[1]))
        try:
            yield
        finally:
            connection.close()
            connection.settings_dict.update(saved)


def test_a_store_that_does_not_answer_is_503_within_the_sources_budget(database_silent):
    # Slack's budget is 3 s; the server's header read may have taken 1 s of it: 2 s are left
    # for the body and the store, less than the store's own 5 s and the writer's connect.
    body = json.dumps({"type": "event_callback", "event_id": "Ev1"}).encode()
    signed = slack_headers(body, os.environ["SLACK_SIGNING_SECRET"], int(time.time()))
    started = time.monotonic()

    status, headers, answer = call_asgi(
        webhook_app(header_read_timeout_seconds=1),
        asgi_scope("/webhooks/slack/", {**signed, "Content-Length": str(len(body))}),
        _whole(body),
    )

    assert (status, json.loads(answer)["error"]) == (503, "store_unavailable")
    assert "retry-after" in headers
    assert time.monotonic() - started < 3.0


def _whole(body: bytes) -> Callable[[], Any]:
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def test_past_the_webhooks_in_progress_the_next_is_503_at_once_its_body_unread():
    app = webhook_app(max_requests=1)
    read: list[str] = []

    async def trickle() -> dict:
        read.append("trickler")
        await asyncio.Event().wait()  # its body never comes
        raise AssertionError("unreachable")

    async def whole() -> dict:
        read.append("second")
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def both() -> Reply:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        scope = asgi_scope("/webhooks/stripe/", {**SIGNED, "Content-Length": "2"})
        slow = asyncio.create_task(app(scope, trickle, send))
        await asyncio.sleep(0)  # the trickler is past its head, waiting for its body
        await app(scope, whole, send)
        slow.cancel()
        await app.writer.aclose()
        start, answer = sent
        fields = {name.decode(): value.decode() for name, value in start["headers"]}
        return start["status"], fields, answer["body"]

    status, headers, answer = asyncio.run(both())

    assert (status, json.loads(answer)["error"]) == (503, "busy")
    assert headers["retry-after"] == str(settings.INGRESS_UNAVAILABLE_RETRY_AFTER)
    assert read == ["trickler"]  # the second one's body was never read
    assert app.requests == 0 and app.body_bytes == 0
    assert not RawEvent.objects.exists()


def test_body_bytes_are_bounded_per_process_not_per_request():
    # Two requests of 600 bytes each under a process cap of 1,000: the first holds its 600
    # (its body incomplete), the second's chunk would pass the cap and is refused at once.
    app = webhook_app(max_body_bytes=1000)
    first_chunk = asyncio.Event()

    async def first() -> dict:
        if not first_chunk.is_set():
            first_chunk.set()
            return {"type": "http.request", "body": b"x" * 600, "more_body": True}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def second() -> dict:
        return {"type": "http.request", "body": b"y" * 600, "more_body": False}

    async def both() -> tuple[list[dict], int]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        scope = asgi_scope("/webhooks/stripe/", {**SIGNED, "Content-Length": "600"})
        slow = asyncio.create_task(app(scope, first, send))
        await first_chunk.wait()
        await asyncio.sleep(0)
        held = app.body_bytes
        await app(scope, second, send)
        slow.cancel()
        await asyncio.gather(slow, return_exceptions=True)
        await app.writer.aclose()
        return sent, held

    sent, held = asyncio.run(both())

    assert held == 600
    assert sent[0]["status"] == 503 and json.loads(sent[1]["body"])["error"] == "busy"
    assert app.body_bytes == 0 and app.requests == 0  # given back, the cancelled one's too
    assert not RawEvent.objects.exists()
