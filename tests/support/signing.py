"""Signing helpers for tests: each provider's own scheme, through its own SDK where one exists."""

import hashlib
import hmac
import json
import os
import time
from datetime import UTC, datetime

import stripe
from standardwebhooks.webhooks import Webhook


def github_headers(
    body: bytes, *, secret: str | None = None, event: str = "push", delivery: str = "d-1"
) -> dict[str, str]:
    secret = secret if secret is not None else _env("GITHUB_WEBHOOK_SECRET")
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "HTTP_X_HUB_SIGNATURE_256": f"sha256={digest}",
        "HTTP_X_GITHUB_EVENT": event,
        "HTTP_X_GITHUB_DELIVERY": delivery,
    }


def stripe_event(event_id: str, event_type: str, data: dict | None = None) -> bytes:
    return json.dumps(
        {"id": event_id, "object": "event", "type": event_type, "data": {"object": data or {}}}
    ).encode()


def stripe_headers(
    body: bytes, *, secret: str | None = None, timestamp: int | None = None
) -> dict[str, str]:
    secret = secret if secret is not None else _env("STRIPE_WEBHOOK_SECRET")
    timestamp = int(time.time()) if timestamp is None else timestamp
    signature = stripe.WebhookSignature._compute_signature(f"{timestamp}.{body.decode()}", secret)
    return {"HTTP_STRIPE_SIGNATURE": f"t={timestamp},v1={signature}"}


def standard_headers(
    body: bytes, *, msg_id: str, secret: str | None = None, timestamp: int | None = None
) -> dict[str, str]:
    secret = secret if secret is not None else _env("RENDERER_WEBHOOK_SECRET")
    when = datetime.fromtimestamp(int(time.time()) if timestamp is None else timestamp, tz=UTC)
    signature = Webhook(secret).sign(msg_id, when, body.decode())
    return {
        "HTTP_WEBHOOK_ID": msg_id,
        "HTTP_WEBHOOK_TIMESTAMP": str(int(when.timestamp())),
        "HTTP_WEBHOOK_SIGNATURE": signature,
    }


def _env(name: str) -> str:
    # eventdrop/settings_test.py puts the test secrets into the environment.
    return os.environ[name]


def store_signed_stripe_event(body: bytes, *, timestamp: int | None = None):
    """Store a Stripe-signed body through the real receive service, as the view would."""
    from ingress.services import raw_event_store
    from ingress.sources import all_sources

    headers = {
        "stripe-signature": stripe_headers(body, timestamp=timestamp)["HTTP_STRIPE_SIGNATURE"],
        "content-type": "application/json",
    }
    return raw_event_store(
        source=all_sources()["stripe"],
        method="POST",
        path="/webhooks/stripe/",
        query_string="",
        headers=headers,
        body=body,
        remote_addr="127.0.0.1",
    )


def checkout_session_event(
    recap_id: str, *, event_type: str = "checkout.session.completed"
) -> bytes:
    """A paid checkout of `recap_id` as Stripe sends it (its session named after the recap)."""
    session = f"cs_{recap_id.replace('-', '')}"
    return json.dumps(
        {
            "id": f"evt_{event_type}_{session}",
            "object": "event",
            "type": event_type,
            "created": int(time.time()),
            "data": {
                "object": {
                    "id": session,
                    "object": "checkout.session",
                    "payment_status": "paid",
                    "payment_intent": f"pi_{session}",
                    "metadata": {"recap_id": recap_id},
                }
            },
        }
    ).encode()


def post_signed_stripe(base_url: str, body: bytes) -> None:
    """POST a body to a running web server as Stripe does, signed with the Stripe SDK's own
    header; the server must acknowledge it (202)."""
    import requests

    signature = stripe.WebhookSignature.generate_signature_header(
        body.decode(), _env("STRIPE_WEBHOOK_SECRET")
    )
    answer = requests.post(
        f"{base_url}/webhooks/stripe/",
        data=body,
        headers={"Stripe-Signature": signature, "Content-Type": "application/json"},
        timeout=(2, 10),
    )
    assert answer.status_code == 202, answer.text
