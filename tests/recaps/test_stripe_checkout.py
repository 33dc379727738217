"""Stripe Checkout through the real stripe SDK, against a local fake Stripe over real HTTP."""

import time

import pytest

from recaps.errors import CHECKOUT_UNAVAILABLE, CheckoutNotConfigured, CheckoutUnavailable
from recaps.services import (
    CheckoutEvent,
    CheckoutEventKind,
    checkout_event_apply,
    recap_checkout_create,
)
from tests.recaps.factories import RecapFactory
from tests.recaps.fixtures import T0

pytestmark = pytest.mark.django_db


def test_creates_a_session_with_the_recap_id_in_its_metadata(fake_stripe):
    recap = RecapFactory.create()
    checkout = recap_checkout_create(recap=recap, buyer=recap.buyer)
    recap.refresh_from_db()
    assert checkout.session_id == "cs_test_1" == recap.checkout_session_id
    assert checkout.url == f"{fake_stripe.url}/c/pay/cs_test_1"
    (request,) = fake_stripe.requests
    form = request["form"]
    assert form["metadata[recap_id]"] == str(recap.id)
    assert form["payment_intent_data[metadata][recap_id]"] == str(recap.id)
    assert form["client_reference_id"] == str(recap.id)
    assert form["mode"] == "payment"
    assert form["line_items[0][price_data][unit_amount]"] == "990"
    assert form["line_items[0][price_data][currency]"] == "eur"
    assert form["success_url"].endswith(f"/recaps/{recap.id}/?checkout=success")
    assert request["authorization"] == "Bearer sk_test_eventdrop"
    assert request["idempotency_key"] == f"recap-checkout-{recap.id}"


def test_a_second_request_gets_the_same_session(fake_stripe):
    recap = RecapFactory.create()
    first = recap_checkout_create(recap=recap, buyer=recap.buyer)
    second = recap_checkout_create(recap=recap, buyer=recap.buyer)
    assert first == second and len(fake_stripe.sessions) == 1


def test_after_its_checkout_expired_a_recap_gets_a_new_session(fake_stripe):
    recap = RecapFactory.create()
    first = recap_checkout_create(recap=recap, buyer=recap.buyer)
    checkout_event_apply(
        recap_id=recap.id,
        event=CheckoutEvent(
            kind=CheckoutEventKind.EXPIRED, session_id=first.session_id, created_at=T0
        ),
    )
    second = recap_checkout_create(recap=recap, buyer=recap.buyer)
    recap.refresh_from_db()
    assert second.session_id != first.session_id == "cs_test_1"
    assert (recap.status, recap.checkout_session_id) == ("pending_payment", second.session_id)
    assert fake_stripe.requests[-1]["idempotency_key"] == (
        f"recap-checkout-{recap.id}-after-{first.session_id}"
    )


def test_the_sdk_timeout_is_explicit_and_bounded(fake_stripe):
    fake_stripe.mode = "hang"
    recap = RecapFactory.create()
    started = time.monotonic()
    with pytest.raises(CheckoutUnavailable) as exc:
        recap_checkout_create(recap=recap, buyer=recap.buyer)
    assert str(exc.value) == CHECKOUT_UNAVAILABLE
    assert time.monotonic() - started < 1.5  # read timeout 0.3 s, not the SDK's 80 s default
    recap.refresh_from_db()
    assert recap.checkout_session_id == "" and recap.status == "pending_payment"


def test_sdk_retries_reuse_the_idempotency_key(fake_stripe, settings):
    settings.STRIPE_MAX_NETWORK_RETRIES = 1
    fake_stripe.mode = "error_500"
    recap = RecapFactory.create()
    with pytest.raises(CheckoutUnavailable):
        recap_checkout_create(recap=recap, buyer=recap.buyer)
    keys = [r["idempotency_key"] for r in fake_stripe.requests]
    assert keys == [f"recap-checkout-{recap.id}"] * 2


def test_without_an_api_key_nothing_is_sent(fake_stripe, settings):
    settings.STRIPE_API_KEY = ""
    recap = RecapFactory.create()
    with pytest.raises(CheckoutNotConfigured):
        recap_checkout_create(recap=recap, buyer=recap.buyer)
    assert fake_stripe.requests == []
