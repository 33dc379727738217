"""The buyer API: every refusal is a clear 4xx (or 503) problem (RFC 9457), never a 500."""

import uuid

import pytest
from rest_framework.test import APIClient

from outbox.models import RecapSideEffect
from recaps.errors import (
    CHECKOUT_NOT_CONFIGURED,
    CHECKOUT_UNAVAILABLE,
    EVENT_UNKNOWN,
    RECAP_ALREADY_REDEEMED,
    RECAP_IS_FREE,
    RECAP_NOT_FOUND,
    RECAP_NOT_FREE,
    RECAP_NOT_PAYABLE,
    RECAP_NOT_YOURS,
)
from recaps.models import RecapStatus
from tests.recaps.factories import EventFactory, RecapFactory, UserFactory
from tests.recaps.fixtures import pay

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return APIClient()


def problem_of(response) -> tuple[str, str]:
    """The code and text of an RFC 9457 problem answer (kernel/problems.py)."""
    body = response.json()
    assert response["Content-Type"] == "application/problem+json"
    return body["type"].removeprefix("urn:eventdrop:problem:"), body["detail"]


def signed_in(api, user):
    api.force_authenticate(user=user)
    return api


def redeem(api, recap_id):
    return api.post(f"/recaps/{recap_id}/redeem/", {}, format="json")


def checkout(api, recap_id):
    return api.post(f"/recaps/{recap_id}/checkout/", {}, format="json")


# --- free redemption ------------------------------------------------------------------------


def test_the_buyer_redeems_a_free_recap_through_the_same_service(api):
    recap = RecapFactory.create(is_free=True)
    response = redeem(signed_in(api, recap.buyer), recap.id)
    assert response.status_code == 200
    assert response.json()["status"] == "paid"
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID and recap.payment_reference == ""
    assert RecapSideEffect.objects.filter(recap=recap, status="pending").count() == 1


def test_anonymous_gets_401(api):
    recap = RecapFactory.create(is_free=True)
    response = redeem(api, recap.id)
    assert response.status_code == 401
    # A token is asked for, never Basic (which a browser would prompt for, then cache).
    assert response["WWW-Authenticate"] == "Token"


def test_session_login_works_too(client):
    recap = RecapFactory.create(is_free=True)
    client.force_login(recap.buyer)
    response = client.post(f"/recaps/{recap.id}/redeem/", {}, content_type="application/json")
    assert response.status_code == 200


def test_someone_elses_recap_is_403(api):
    recap = RecapFactory.create(is_free=True)
    response = redeem(signed_in(api, UserFactory.create()), recap.id)
    assert response.status_code == 403
    assert problem_of(response) == ("forbidden", RECAP_NOT_YOURS)


def test_a_paid_for_recap_cannot_be_redeemed_for_free_403(api):
    recap = RecapFactory.create(is_free=False)
    response = redeem(signed_in(api, recap.buyer), recap.id)
    assert response.status_code == 403
    assert problem_of(response) == ("forbidden", RECAP_NOT_FREE)


def test_unknown_recap_is_404(api):
    response = redeem(signed_in(api, UserFactory.create()), uuid.uuid4())
    assert response.status_code == 404
    assert problem_of(response) == ("recap_not_found", RECAP_NOT_FOUND)


def test_redeeming_twice_is_409(api):
    recap = RecapFactory.create(is_free=True)
    signed_in(api, recap.buyer)
    assert redeem(api, recap.id).status_code == 200
    response = redeem(api, recap.id)
    assert response.status_code == 409
    assert problem_of(response) == ("conflict", RECAP_ALREADY_REDEEMED)
    assert RecapSideEffect.objects.filter(recap=recap).count() == 1


# --- purchase and status --------------------------------------------------------------------


def test_purchase_creates_the_recap_and_its_checkout(api, fake_stripe):
    user = UserFactory.create()
    event = EventFactory.create()
    response = signed_in(api, user).post("/recaps/", {"event_id": event.id}, format="json")
    assert response.status_code == 201
    data = response.json()
    assert data["status"] == "pending_payment" and data["event_id"] == event.id
    assert data["checkout_url"] == f"{fake_stripe.url}/c/pay/cs_test_1"
    assert fake_stripe.requests[0]["form"]["metadata[recap_id]"] == data["id"]


def test_purchase_of_an_unknown_event_is_404(api, fake_stripe):
    client = signed_in(api, UserFactory.create())
    response = client.post("/recaps/", {"event_id": 999}, format="json")
    assert response.status_code == 404
    assert problem_of(response) == ("event_not_found", EVENT_UNKNOWN)
    assert fake_stripe.requests == []


def test_purchase_input_is_validated(api):
    client = signed_in(api, UserFactory.create())
    response = client.post("/recaps/", {"event_id": "x"}, format="json")
    assert response.status_code == 400


def test_purchase_while_stripe_is_down_is_503_and_the_recap_waits(api, fake_stripe):
    fake_stripe.mode = "error_500"
    response = signed_in(api, UserFactory.create()).post(
        "/recaps/", {"event_id": EventFactory.create().id}, format="json"
    )
    assert response.status_code == 503
    data = response.json()
    assert data["type"] == "urn:eventdrop:problem:checkout_unavailable"
    assert data["detail"] == CHECKOUT_UNAVAILABLE
    assert data["recap"]["status"] == "pending_payment"
    # Stripe is back: the buyer retries the checkout of the same recap.
    fake_stripe.mode = "ok"
    retry = checkout(api, data["recap"]["id"])
    assert retry.status_code == 201 and retry.json()["session_id"] == "cs_test_1"


def test_purchase_without_stripe_configured_is_503(api, settings):
    settings.STRIPE_API_KEY = ""
    response = signed_in(api, UserFactory.create()).post(
        "/recaps/", {"event_id": EventFactory.create().id}, format="json"
    )
    assert response.status_code == 503
    assert response.json()["detail"] == CHECKOUT_NOT_CONFIGURED


@pytest.mark.parametrize(
    ("free", "paid", "status", "message"),
    [(True, False, 403, RECAP_IS_FREE), (False, True, 409, RECAP_NOT_PAYABLE)],
)
def test_checkout_refusals(api, fake_stripe, free, paid, status, message):
    recap = RecapFactory.create(is_free=free)
    if paid:
        pay(recap)
    response = checkout(signed_in(api, recap.buyer), recap.id)
    assert response.status_code == status and response.json()["detail"] == message
    assert fake_stripe.requests == []


def test_checkout_of_someone_elses_recap_is_403(api, fake_stripe):
    recap = RecapFactory.create()
    response = checkout(signed_in(api, UserFactory.create()), recap.id)
    assert response.status_code == 403 and fake_stripe.requests == []


def test_the_buyer_sees_the_status(api):
    recap = RecapFactory.create()
    signed_in(api, recap.buyer)
    response = api.get(f"/recaps/{recap.id}/")
    assert response.status_code == 200
    assert response.json()["status"] == "pending_payment"
    stranger = signed_in(APIClient(), UserFactory.create())
    assert stranger.get(f"/recaps/{recap.id}/").status_code == 403
    assert api.get(f"/recaps/{uuid.uuid4()}/").status_code == 404
    assert APIClient().get(f"/recaps/{recap.id}/").status_code == 401
