"""End to end, through HTTP all the way:

buyer POST /recaps/ → Stripe Checkout (fake Stripe, real SDK) → Stripe event signed with the
SDK's own signature generation → POST /webhooks/stripe/ → inbox (verify, dedup, deliver) →
handler → recap paid + outbox row → dispatcher → fake render service → signed Standard
Webhooks callback → POST /webhooks/renderer/ → inbox → handler → recap ready.

The app runs in pytest-django's live server (a real HTTP server in a thread); the fake
render service POSTs its callback there, as the real one would.
"""

import json
import os
import time

import pytest
import requests
import stripe
from knox.models import AuthToken

from ingress.inbox import inbox_run_once
from ingress.models import RawEvent
from outbox.dispatcher import dispatch_run
from outbox.models import RecapSideEffect
from recaps.models import RecapStatus, RecapVideo
from tests.recaps.factories import EventFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = (2, 10)


def wait_for(condition, seconds: float = 10.0) -> bool:
    """Poll a condition for a bounded time (the callback arrives on another thread)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def checkout_completed(session_id: str, recap_id: str) -> bytes:
    return json.dumps(
        {
            "id": "evt_e2e_1",
            "object": "event",
            "type": "checkout.session.completed",
            "data": {
                "object": {
                    "id": session_id,
                    "object": "checkout.session",
                    "payment_status": "paid",
                    "payment_intent": "pi_e2e_1",
                    "metadata": {"recap_id": recap_id},
                }
            },
        }
    ).encode()


def test_paid_recap_renders_and_becomes_ready_through_http(
    live_server, fake_stripe, fake_renderer, settings
):
    settings.RENDER_CALLBACK_URL = f"{live_server.url}/webhooks/renderer/"
    settings.RENDER_READ_TIMEOUT_SECONDS = 5.0
    settings.RENDER_TIMEOUT_SECONDS = 6.0
    settings.STRIPE_READ_TIMEOUT_SECONDS = 5.0
    fake_renderer.configure(callbacks=True, complete_after=0.05)
    buyer = UserFactory.create()
    event = EventFactory.create()

    # 1. The buyer starts a purchase: a recap waiting for payment, and a checkout session.
    response = requests.post(
        f"{live_server.url}/recaps/",
        json={"event_id": event.id},
        headers={"Authorization": f"Token {AuthToken.objects.create(buyer)[1]}"},
        timeout=TIMEOUT,
    )
    assert response.status_code == 201, response.text
    recap_id = response.json()["id"]
    session_id = fake_stripe.sessions[f"recap-checkout-{recap_id}"]["id"]

    # 2. Stripe reports the payment: signed exactly as Stripe signs, POSTed to the ingress.
    body = checkout_completed(session_id, recap_id)
    signature = stripe.WebhookSignature.generate_signature_header(
        body.decode(), os.environ["STRIPE_WEBHOOK_SECRET"]
    )
    response = requests.post(
        f"{live_server.url}/webhooks/stripe/",
        data=body,
        headers={"Stripe-Signature": signature, "Content-Type": "application/json"},
        timeout=TIMEOUT,
    )
    assert response.status_code == 202, response.text
    recap = RecapVideo.objects.get(pk=recap_id)
    assert recap.status == RecapStatus.PENDING_PAYMENT  # the ACK did nothing but store it

    # 3. The inbox verifies, deduplicates and runs the handler: paid + one outbox row.
    inbox_run_once()
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID and recap.payment_reference == "pi_e2e_1"
    side_effect = RecapSideEffect.objects.get(recap=recap)
    assert side_effect.status == "pending"

    # 4. The dispatcher asks the render service; the render is accepted.
    report = dispatch_run()
    assert report.count("done") == 1, report.summary()
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING

    # 5. The render service calls back through the ingress (signed Standard Webhooks).
    # (The fake records the callback once our 202 has reached it, after the row exists.)
    assert wait_for(lambda: fake_renderer.callbacks_sent)
    assert fake_renderer.callbacks_sent[0][2] == 202
    inbox_run_once()

    recap.refresh_from_db()
    render = fake_renderer.renders[side_effect.idempotency_key]
    assert recap.status == RecapStatus.READY
    assert recap.video_url == f"https://videos.eventdrop.invalid/{render.render_id}.mp4"
    assert len(fake_renderer.renders) == 1
    callback = RawEvent.objects.get(source="renderer")
    assert callback.signature_status == "verified"
    assert callback.event_type == "render.completed"
