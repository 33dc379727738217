"""The receive path through Django's real HTTP handling (test client, real database)."""

import hashlib
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ingress.models import RawEvent

pytestmark = pytest.mark.django_db

STRIPE_HEADERS = {"HTTP_STRIPE_SIGNATURE": "t=1700000000,v1=deadbeef"}


def post(client, source, body=b"{}", content_type="application/json", **extra):
    return client.generic("POST", f"/webhooks/{source}/", body, content_type=content_type, **extra)


def test_accepts_and_stores_exact_bytes_and_headers(client):
    body = b'{"id": "evt_1", "note": "caf\xc3\xa9"}'
    response = post(
        client,
        "github",
        body,
        HTTP_X_HUB_SIGNATURE_256="sha256=abc",
        HTTP_X_GITHUB_DELIVERY="72d3162e-cc78-11e3-81ab-4c9367dc0958",
        HTTP_X_GITHUB_EVENT="push",
        QUERY_STRING="a=1&b=2",
    )
    assert response.status_code == 202
    event = RawEvent.objects.get(pk=response.json()["id"])
    # The answer is json.dumps' own form, byte for byte (the view writes it without it).
    assert response.content == json.dumps({"id": event.pk, "status": "accepted"}).encode()
    assert response["Content-Type"] == "application/json"
    assert bytes(event.body) == body
    assert event.body_sha256 == hashlib.sha256(body).hexdigest()
    assert event.source == "github" and event.provider == "github"
    assert event.method == "POST" and event.path == "/webhooks/github/"
    assert event.query_string == "a=1&b=2"
    assert event.headers["x-github-event"] == "push"
    assert event.headers["x-hub-signature-256"] == "sha256=abc"
    assert event.headers["content-type"] == "application/json"
    assert event.delivery_id == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert event.signature_status == "pending" and event.rejection_reason == ""
    assert event.remote_addr == "127.0.0.1"


def test_non_utf8_body_round_trips_byte_for_byte(client):
    body = bytes(range(256)) * 3
    response = post(
        client, "stripe", body, content_type="application/octet-stream", **STRIPE_HEADERS
    )
    assert response.status_code == 202
    assert bytes(RawEvent.objects.get().body) == body


def test_hop_by_hop_and_credential_headers_are_not_stored(client):
    response = post(
        client,
        "stripe",
        HTTP_CONNECTION="keep-alive",
        HTTP_AUTHORIZATION="Basic x",
        HTTP_COOKIE="a=b",
        **STRIPE_HEADERS,
    )
    assert response.status_code == 202
    headers = RawEvent.objects.get().headers
    assert "connection" not in headers and "authorization" not in headers
    assert "cookie" not in headers and "stripe-signature" in headers


def test_receive_path_issues_exactly_one_query_an_insert(client):
    with CaptureQueriesContext(connection) as queries:
        response = post(client, "stripe", **STRIPE_HEADERS)
    assert response.status_code == 202
    assert len(queries) == 1
    assert queries[0]["sql"].lstrip().upper().startswith("INSERT")


@pytest.mark.parametrize(
    ("source", "method", "status", "code"),
    [
        ("nope", "POST", 404, "unknown_source"),
        ("stripe", "GET", 405, "method_not_allowed"),
        ("stripe", "PUT", 405, "method_not_allowed"),
    ],
)
def test_rejections_before_the_body(client, source, method, status, code):
    response = client.generic(method, f"/webhooks/{source}/", b"{}", **STRIPE_HEADERS)
    assert response.status_code == status
    assert response.json()["error"] == code
    assert not RawEvent.objects.exists()


def test_disabled_source_is_404(client, monkeypatch):
    from ingress.sources import reset_sources_cache

    monkeypatch.setenv("WEBHOOK_STRIPE_ENABLED", "false")
    reset_sources_cache()
    try:
        response = post(client, "stripe", **STRIPE_HEADERS)
    finally:
        monkeypatch.delenv("WEBHOOK_STRIPE_ENABLED")
        reset_sources_cache()
    assert response.status_code == 404
    assert not RawEvent.objects.exists()


def test_missing_signature_header_is_400_without_a_row(client):
    response = post(client, "stripe")
    assert response.status_code == 400
    assert response.json()["error"] == "missing_signature"
    assert "stripe-signature" in response.json()["message"]
    assert not RawEvent.objects.exists()


class ExplodingStream:
    """A wsgi.input that fails the test if anybody reads it."""

    def read(self, *args):
        raise AssertionError("the body was read")

    readline = read


def test_oversized_content_length_is_413_before_the_body_is_read(client):
    response = client.generic(
        "POST",
        "/webhooks/stripe/",
        b"",
        content_type="application/json",
        CONTENT_LENGTH=str(1024 * 1024 + 1),
        **{"wsgi.input": ExplodingStream()},
        **STRIPE_HEADERS,
    )
    assert response.status_code == 413
    assert response.json()["error"] == "body_too_large"
    assert not RawEvent.objects.exists()


def test_bad_content_length_is_400(client):
    response = client.generic(
        "POST", "/webhooks/stripe/", b"{}", CONTENT_LENGTH="ten", **STRIPE_HEADERS
    )
    assert response.status_code == 400
    assert response.json()["error"] == "bad_content_length"


class ShortStream:
    """A wsgi.input that ends early, as a server's reader does when the client stops
    sending (gunicorn, Django's LimitedStream: fewer bytes, no error)."""

    def __init__(self, data: bytes):
        self.data = data

    def read(self, size: int = -1) -> bytes:
        size = len(self.data) if size is None or size < 0 else size
        piece, self.data = self.data[:size], self.data[size:]
        return piece

    readline = read


def test_body_shorter_than_its_content_length_is_400_without_a_row(client):
    response = client.generic(
        "POST",
        "/webhooks/stripe/",
        b"",
        content_type="application/json",
        CONTENT_LENGTH="500",
        **{"wsgi.input": ShortStream(b"y" * 102)},
        **STRIPE_HEADERS,
    )
    assert response.status_code == 400
    assert response.json()["error"] == "truncated_body"
    assert "102 of the 500" in response.json()["message"]
    assert not RawEvent.objects.exists()


class BrokenChunkStream:
    """A wsgi.input whose server-side reader fails on the framing (gunicorn raises its own
    InvalidChunkSize, a ParseException; a reset connection raises OSError)."""

    def read(self, *args):
        raise ValueError("Invalid chunk size: 'zz'")

    readline = read


def test_body_the_server_cannot_read_is_400_without_a_row(client):
    response = client.generic(
        "POST",
        "/webhooks/stripe/",
        b"",
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="chunked",
        **{"wsgi.input": BrokenChunkStream(), "wsgi.input_terminated": True},
        **STRIPE_HEADERS,
    )
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_body"
    assert not RawEvent.objects.exists()


def test_neither_length_nor_chunked_is_411_even_when_the_server_says_terminated(client):
    # Some WSGI servers (granian's WSGI mode) mark every input terminated, with a body or
    # without.
    response = client.generic(
        "POST",
        "/webhooks/stripe/",
        b"",
        **{"wsgi.input": ShortStream(b""), "wsgi.input_terminated": True},
        **STRIPE_HEADERS,
    )
    assert response.status_code == 411
    assert response.json()["error"] == "length_required"
    assert not RawEvent.objects.exists()


@pytest.mark.parametrize("debug", [True, False])
def test_both_spellings_of_the_webhook_url_are_stored(client, settings, debug):
    # APPEND_SLASH would answer a POST without the slash with 301 (a RuntimeError in debug),
    # and no provider re-POSTs a body to a redirect.
    settings.DEBUG = debug
    for path in ("/webhooks/github/", "/webhooks/github"):
        body = b'{"path": "%s"}' % path.encode()
        response = client.generic(
            "POST", path, body, content_type="application/json", HTTP_X_HUB_SIGNATURE_256="x"
        )
        assert response.status_code == 202, (path, response.status_code)
        event = RawEvent.objects.get(pk=response.json()["id"])
        assert bytes(event.body) == body and event.path == path


def _padding_headers(total: int) -> dict[str, str]:
    """HTTP_X_PAD_n headers of about `total` bytes together."""
    count = total // 8000 + 1
    return {f"HTTP_X_PAD_{n}": "p" * (total // count) for n in range(count)}


def test_headers_over_the_source_limit_are_431_before_any_write(client):
    with CaptureQueriesContext(connection) as queries:
        response = post(client, "stripe", **_padding_headers(40_000), **STRIPE_HEADERS)
    assert response.status_code == 431
    assert response.json()["error"] == "headers_too_large"
    assert "32768" in response.json()["message"]
    assert len(queries) == 0
    assert not RawEvent.objects.exists()


def test_headers_under_the_source_limit_are_stored(client):
    response = post(client, "stripe", **_padding_headers(30_000), **STRIPE_HEADERS)
    assert response.status_code == 202
    assert len(RawEvent.objects.get().headers["x-pad-0"]) > 7000


def test_max_header_bytes_is_a_per_source_option(client, monkeypatch):
    from ingress.sources import all_sources, reset_sources_cache

    monkeypatch.setenv("WEBHOOK_STRIPE_MAX_HEADER_BYTES", "4096")
    reset_sources_cache()
    try:
        assert all_sources()["stripe"].max_header_bytes == 4096
        assert all_sources()["github"].max_header_bytes == 32 * 1024
        response = post(client, "stripe", **_padding_headers(5_000), **STRIPE_HEADERS)
    finally:
        monkeypatch.delenv("WEBHOOK_STRIPE_MAX_HEADER_BYTES")
        reset_sources_cache()
    assert response.status_code == 431
    assert not RawEvent.objects.exists()
