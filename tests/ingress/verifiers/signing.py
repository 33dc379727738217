"""Requests signed the way each provider signs them, with the provider's own code where one
exists (the stripe SDK, the standardwebhooks package), so the tests do not grade the
verifiers against a copy of their own math."""

import hashlib
import hmac
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

import stripe
from standardwebhooks.webhooks import Webhook

from ingress.providers import PROVIDERS as PROVIDERS_TABLE
from ingress.sources import Source
from ingress.verifiers.base import StoredRequest

RECEIVED_AT = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
SIGNED_AT = int((RECEIVED_AT - timedelta(seconds=2)).timestamp())
TOLERANCE = 300

# Two secrets per provider: index 0 is the old one, index 1 the new one during a rotation.
SECRETS: dict[str, tuple[str, str]] = {
    "stripe": ("whsec_old_stripe_secret", "whsec_new_stripe_secret"),
    "github": ("It's a Secret to Everybody", "a newer secret"),
    "slack": ("8f742231b10e8888abcd99yyyzzz85a5", "a1b2c3d4e5f60718293a4b5c6d7e8f90"),
    "standard": (
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "whsec_bmV3LXJlbmRlci1zZXJ2aWNlLWtleS0zMi1ieXRlcyE=",
    ),
    "hmac": ("generic-old", "generic-new"),
}

BODIES: dict[str, bytes] = {
    "stripe": b'{"id": "evt_1PxYz", "object": "event", "type": "checkout.session.completed"}',
    "github": b'{"zen": "Keep it logically awesome.", "hook_id": 1}',
    "slack": (
        b'{"type": "event_callback", "event_id": "Ev08MFMKH6", '
        b'"event": {"type": "app_mention", "text": "hi"}}'
    ),
    "standard": b'{"type": "recap.rendered", "data": {"recap": 7}}',
    "hmac": b'{"type": "order.created", "id": "ord_1"}',
}

# What a verified BODIES[provider] with headers from sign() must yield.
EXPECTED: dict[str, tuple[str, str]] = {
    "stripe": ("checkout.session.completed", "evt_1PxYz"),
    "github": ("ping", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
    "slack": ("app_mention", "Ev08MFMKH6"),
    "standard": ("recap.rendered", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"),
    "hmac": ("order.created", "ord_1"),
}

TIMESTAMPED = ("stripe", "slack", "standard")
PROVIDERS = tuple(SECRETS)


def make_source(provider: str, *secrets: str, tolerance_seconds: int = TOLERANCE) -> Source:
    """A Source as ingress/sources.py builds one: the provider table's headers filled in."""
    spec = PROVIDERS_TABLE[provider]
    return Source(
        name=f"test-{provider}",
        provider=provider,
        secrets_env="X",
        secrets=secrets,
        tolerance_seconds=tolerance_seconds,
        signature_header=spec.signature_header,
        delivery_id_header=spec.delivery_id_header,
        signature_prefix="sha256=" if provider == "hmac" else "",
    )


def make_request(
    headers: Mapping[str, str], body: bytes, received_at: datetime = RECEIVED_AT
) -> StoredRequest:
    return StoredRequest(headers=dict(headers), body=body, received_at=received_at)


def hex_hmac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def stripe_headers(body: bytes, secret: str, timestamp: int = SIGNED_AT) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, timestamp)
    return {"stripe-signature": header, "content-type": "application/json; charset=utf-8"}


def github_headers(body: bytes, secret: str, timestamp: int = SIGNED_AT) -> dict[str, str]:
    return {
        "x-hub-signature-256": "sha256=" + hex_hmac(secret, body),
        "x-github-event": "ping",
        "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "content-type": "application/json",
    }


def slack_headers(body: bytes, secret: str, timestamp: int = SIGNED_AT) -> dict[str, str]:
    return {
        "x-slack-signature": "v0=" + hex_hmac(secret, f"v0:{timestamp}:".encode() + body),
        "x-slack-request-timestamp": str(timestamp),
        "content-type": "application/json",
    }


def standard_headers(
    body: bytes,
    secret: str,
    timestamp: int = SIGNED_AT,
    msg_id: str = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
) -> dict[str, str]:
    signed_at = datetime.fromtimestamp(timestamp, tz=UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": Webhook(secret).sign(msg_id, signed_at, body.decode()),
        "content-type": "application/json",
    }


def hmac_headers(body: bytes, secret: str, timestamp: int = SIGNED_AT) -> dict[str, str]:
    return {"x-signature": "sha256=" + hex_hmac(secret, body)}


SIGNERS: dict[str, Callable[..., dict[str, str]]] = {
    "stripe": stripe_headers,
    "github": github_headers,
    "slack": slack_headers,
    "standard": standard_headers,
    "hmac": hmac_headers,
}


def sign(provider: str, secret: str, timestamp: int = SIGNED_AT) -> StoredRequest:
    """BODIES[provider], signed with `secret` at `timestamp`, received at RECEIVED_AT."""
    body = BODIES[provider]
    return make_request(SIGNERS[provider](body, secret, timestamp), body)
