"""The Stripe checkout handler, called directly and through the real inbox."""

import json
import uuid

import pytest
import stripe

from ingress.handlers import PermanentHandlerError, handlers_for
from ingress.inbox import inbox_run_once
from ingress.models import Delivery, RawEvent
from outbox.models import RecapSideEffect
from recaps.errors import RECAP_ALREADY_PAID, RECAP_NOT_FOUND, RECAP_PAYMENT_PAID_ANOTHER
from recaps.handlers import BAD_RECAP_ID, record_checkout_session
from recaps.models import RecapStatus
from tests.recaps.factories import RecapFactory

pytestmark = pytest.mark.django_db

STRIPE = RawEvent(id=1, source="stripe", provider="stripe")


def session_event(recap_id, *, event_type="checkout.session.completed", paid="paid", pi="pi_1"):
    return {
        "id": f"evt_{uuid.uuid4().hex[:10]}",
        "object": "event",
        "type": event_type,
        "data": {
            "object": {
                "id": "cs_test_1",
                "object": "checkout.session",
                "payment_status": paid,
                "payment_intent": pi,
                "metadata": {"recap_id": str(recap_id)},
            }
        },
    }


def test_one_handler_takes_every_checkout_session_event_ordered_by_session():
    for event_type in (
        "checkout.session.completed",
        "checkout.session.async_payment_succeeded",
        "checkout.session.async_payment_failed",
        "checkout.session.expired",
    ):
        (spec,) = handlers_for("stripe", event_type)
        assert spec.name == "recaps.handlers.record_checkout_session"
        assert (spec.ordering_key, spec.event_time) == ("data.object.id", "created")


def test_paid_once_on_duplicate_deliveries():
    recap = RecapFactory.create()
    payload = session_event(recap.id)
    record_checkout_session(STRIPE, payload)
    recap.refresh_from_db()
    paid_at = recap.paid_at
    record_checkout_session(STRIPE, payload)  # Stripe redelivered, or an operator replayed
    record_checkout_session(
        STRIPE, session_event(recap.id, event_type="checkout.session.async_payment_succeeded")
    )
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID and recap.payment_reference == "pi_1"
    assert recap.paid_at == paid_at
    assert RecapSideEffect.objects.filter(recap=recap).count() == 1


def test_completed_but_unpaid_waits_for_async_payment_succeeded():
    recap = RecapFactory.create()
    record_checkout_session(STRIPE, session_event(recap.id, paid="unpaid"))
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PENDING_PAYMENT
    assert not RecapSideEffect.objects.exists()
    record_checkout_session(
        STRIPE, session_event(recap.id, event_type="checkout.session.async_payment_succeeded")
    )
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID


def test_no_payment_required_counts_as_paid_without_a_charge():
    recap = RecapFactory.create()
    payload = session_event(recap.id, paid="no_payment_required", pi=None)
    record_checkout_session(STRIPE, payload)
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID and recap.payment_reference == "cs_test_1"
    assert RecapSideEffect.objects.filter(recap=recap).count() == 1


@pytest.mark.parametrize("payment_status", ["unpaid", None])
def test_a_completion_that_is_not_paid_yet_is_ignored(payment_status):
    recap = RecapFactory.create()
    record_checkout_session(STRIPE, session_event(recap.id, paid=payment_status))
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PENDING_PAYMENT


def test_unknown_recap_is_permanent():
    with pytest.raises(PermanentHandlerError) as exc:
        record_checkout_session(STRIPE, session_event(uuid.uuid4()))
    assert str(exc.value) == RECAP_NOT_FOUND


def test_a_recap_id_that_is_not_a_uuid_is_permanent():
    with pytest.raises(PermanentHandlerError) as exc:
        record_checkout_session(STRIPE, session_event("42"))
    assert str(exc.value) == BAD_RECAP_ID.format(value="42")


def test_a_checkout_without_a_recap_is_not_ours():
    payload = session_event("x")
    del payload["data"]["object"]["metadata"]
    record_checkout_session(STRIPE, payload)  # no error, nothing written
    assert not RecapSideEffect.objects.exists()


def test_one_payment_for_two_recaps_is_refused_for_a_refund():
    first, second = RecapFactory.create(), RecapFactory.create()
    record_checkout_session(STRIPE, session_event(first.id, pi="pi_shared"))
    with pytest.raises(PermanentHandlerError) as exc:
        record_checkout_session(STRIPE, session_event(second.id, pi="pi_shared"))
    assert str(exc.value) == RECAP_PAYMENT_PAID_ANOTHER
    second.refresh_from_db()
    assert second.status == RecapStatus.PENDING_PAYMENT


def test_a_second_payment_for_a_paid_recap_is_refused_for_a_refund():
    recap = RecapFactory.create()
    record_checkout_session(STRIPE, session_event(recap.id, pi="pi_1"))
    with pytest.raises(PermanentHandlerError) as exc:
        record_checkout_session(STRIPE, session_event(recap.id, pi="pi_2"))
    assert str(exc.value) == RECAP_ALREADY_PAID


# --- through the real inbox: signed events, verify, dedup, deliveries -----------------------


def post_stripe(client, payload):
    body = json.dumps(payload)
    header = stripe.WebhookSignature.generate_signature_header(body, "whsec_test_stripe_secret")
    response = client.post(
        "/webhooks/stripe/", body, content_type="application/json", HTTP_STRIPE_SIGNATURE=header
    )
    assert response.status_code == 202


def test_through_the_inbox_duplicates_and_both_events_pay_once(client):
    recap = RecapFactory.create()
    completed = session_event(recap.id)
    post_stripe(client, completed)
    post_stripe(client, completed)  # the same event again: dedup drops it
    post_stripe(
        client, session_event(recap.id, event_type="checkout.session.async_payment_succeeded")
    )
    # One session's events run one at a time (the handler's ordering key): a pass each.
    for _ in range(3):
        inbox_run_once()
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID
    assert RecapSideEffect.objects.filter(recap=recap).count() == 1
    assert Delivery.objects.filter(handler="recaps.handlers.record_checkout_session").count() == 2
    assert set(Delivery.objects.values_list("status", flat=True)) == {"done"}


def test_through_the_inbox_an_unknown_recap_dies_permanently(client):
    post_stripe(client, session_event(uuid.uuid4()))
    inbox_run_once()
    delivery = Delivery.objects.get()
    assert delivery.status == "dead" and delivery.attempts == 1
    assert delivery.last_error == f"PermanentHandlerError: {RECAP_NOT_FOUND}"
