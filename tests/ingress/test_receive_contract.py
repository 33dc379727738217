"""The receive contract, through both adapters of the one receive core (ingress/views.py).

- `django`: the Django view, through Django's test client (make run, a Django-only
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


def via_django(
    path: str, headers: dict[str, str], body: bytes, method: str = "POST"
) -> Reply:
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


def webhook_app() -> WebhookApp:
    return WebhookApp(body_read_timeout_seconds=5, store_connections=1)


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
        ("/webhooks/stripe/", "POST", {"Content-Type": "application/json"}, 400,
         "missing_signature"),
        ("/webhooks/stripe/", "POST", {**SIGNED, "X-Pad": "p" * 40_000}, 431,
         "headers_too_large"),
        ("/webhooks/stripe/", "POST", {**SIGNED, "Content-Length": "ten"}, 400,
         "bad_content_length"),
        ("/webhooks/stripe/", "POST", {**SIGNED, "Content-Length": str(1024 * 1024 + 1)}, 413,
         "body_too_large"),
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
    messages: Iterator[dict] = iter([{"type": "http.request", "body": b"y" * 10, "more_body": True},
                     {"type": "http.disconnect"}])

    async def receive() -> dict:
        return next(messages)

    scope = asgi_scope("/webhooks/stripe/", {**SIGNED, "Content-Length": "500"})
    status, _, answer = call_asgi(webhook_app(), scope, receive)

    assert json.loads(answer) == {
        "error": "truncated_body", "message": "The body ended after 10 of the 500 bytes declared."
    }
    assert status == 400 and not RawEvent.objects.exists()


def test_a_body_that_never_comes_is_408():
    async def receive() -> dict:
        await asyncio.Event().wait()  # the client sends nothing more
        raise AssertionError("unreachable")

    app = WebhookApp(body_read_timeout_seconds=0.2, store_connections=1)
    scope = asgi_scope("/webhooks/stripe/", {**SIGNED, "Content-Length": "2"})
    status, _, answer = call_asgi(app, scope, receive)

    assert (status, json.loads(answer)["error"]) == (408, "body_read_timeout")


def test_paths_under_webhooks_that_name_no_route_are_404():
    for path in ("/webhooks/", "/webhooks/stripe/x/", "/webhooks/st ripe/"):
        status, _, answer = via_asgi(path, SIGNED, b"{}")
        assert status == 404, (path, answer)
    status, _, _ = via_asgi("/webhooks/stripe", SIGNED, b"{}")  # no slash: stored too
    assert status == 202
