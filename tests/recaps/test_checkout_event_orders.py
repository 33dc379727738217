"""Stripe's checkout events for one recap, arriving in EVERY order, through the real inbox.

Each event is a real Stripe shape (built with the SDK's stripe.Event.construct_from, fields
as in Stripe's published fixtures: the event envelope and a checkout.session object), signed
with the Stripe test secret and POSTed to /webhooks/stripe/ as Stripe would; the inbox runs
after each arrival, so the arrival order is the order the handler sees (or, with the
handler's ordering key, the order the inbox lets it see). Only the final recap is asserted:
whatever the order, the product decision is the same.
"""

import itertools
import json
import uuid

import pytest
import stripe
from django.db.models import Max

from ingress.inbox import inbox_run_once
from ingress.models import Delivery
from outbox.models import RecapSideEffect, SideEffectStatus
from outbox.services import side_effects_claim
from recaps.errors import RECAP_PAYMENT_FAILED_TOO_LATE, RECAP_RENDER_ALREADY_REQUESTED
from recaps.handlers import record_checkout_session
from recaps.models import RecapStatus
from recaps.services import recap_mark_rendering
from tests.recaps.factories import RecapFactory
from tests.recaps.fixtures import T0
from tests.recaps.test_handlers import STRIPE

pytestmark = pytest.mark.django_db

SECRET = "whsec_test_stripe_secret"
CREATED = int(T0.timestamp())


def payment_intent_of(session: str) -> str:
    return f"pi_{session.removeprefix('cs_test_')}"


def checkout_event(recap, event_type, *, session, created, payment_status="unpaid"):
    """A Stripe event and its checkout.session, as Stripe sends them (API 2024-06-20)."""
    payment_intent = payment_intent_of(session)
    status = {"checkout.session.expired": "expired"}.get(event_type, "complete")
    if event_type == "checkout.session.async_payment_succeeded":
        payment_status = "paid"
    session_object = {
        "id": session,
        "object": "checkout.session",
        "after_expiration": None,
        "allow_promotion_codes": None,
        "amount_subtotal": 1500,
        "amount_total": 0 if payment_status == "no_payment_required" else 1500,
        "automatic_tax": {"enabled": False, "liability": None, "status": None},
        "cancel_url": f"https://eventdrop.example/recaps/{recap.id}/cancelled",
        "client_reference_id": str(recap.id),
        "created": CREATED - 60,
        "currency": "eur",
        "customer": None,
        "customer_creation": "if_required",
        "customer_details": None,
        "expires_at": CREATED + 86400,
        "livemode": False,
        "metadata": {"recap_id": str(recap.id)},
        "mode": "payment",
        "payment_intent": None if payment_status == "no_payment_required" else payment_intent,
        "payment_method_types": ["card", "sepa_debit"],
        "payment_status": payment_status if status == "complete" else "unpaid",
        "status": status,
        "success_url": f"https://eventdrop.example/recaps/{recap.id}/thanks",
        "total_details": {"amount_discount": 0, "amount_shipping": 0, "amount_tax": 0},
        "url": None,
    }
    return stripe.Event.construct_from(
        {
            "id": f"evt_{uuid.uuid4().hex[:24]}",
            "object": "event",
            "api_version": "2024-06-20",
            "created": created,
            "data": {"object": session_object},
            "livemode": False,
            "pending_webhooks": 1,
            "request": {"id": None, "idempotency_key": None},
            "type": event_type,
        },
        None,
    )


def post_and_run(client, event) -> None:
    body = json.dumps(event.to_dict())
    header = stripe.WebhookSignature.generate_signature_header(body, SECRET)
    response = client.post(
        "/webhooks/stripe/", body, content_type="application/json", HTTP_STRIPE_SIGNATURE=header
    )
    assert response.status_code == 202
    inbox_run_once()


def arrive_in_every_order(client, make_events):
    """For each order: a fresh recap, its events POSTed one by one in that order, the
    inbox run after each. Yields (order, recap, statuses): the event types in arrival
    order, the recap as it ended, and each event type's delivery status."""
    count = len(make_events(RecapFactory.build(), "cs_probe"))
    for order in itertools.permutations(range(count)):
        session = f"cs_test_{uuid.uuid4().hex[:16]}"
        recap = RecapFactory.create(checkout_session_id=session)
        events = make_events(recap, session)
        before = Delivery.objects.aggregate(last=Max("id"))["last"] or 0
        for index in order:
            post_and_run(client, events[index])
        recap.refresh_from_db()
        deliveries = list(
            Delivery.objects.filter(
                handler="recaps.handlers.record_checkout_session", id__gt=before
            ).values_list("raw_event__event_type", "status", "last_error")
        )
        assert len(deliveries) == count, (order, deliveries)
        # Handled, or superseded by a newer event of the session: never dead, never waiting.
        statuses = {
            kind.removeprefix("checkout.session."): status for kind, status, _ in deliveries
        }
        assert set(statuses.values()) <= {"done", "superseded"}, (order, deliveries)
        yield [events[i].type.removeprefix("checkout.session.") for i in order], recap, statuses


def render_rows(recap) -> int:
    return RecapSideEffect.objects.filter(recap=recap).count()


def asynchronous_payment(*outcomes: str):
    """The events of a checkout paid by an asynchronous method: completed (`unpaid`), then
    each of `outcomes` ("succeeded", "failed") ten seconds after the one before, by
    Stripe's clock."""

    def events(recap, session):
        return [
            checkout_event(recap, "checkout.session.completed", session=session, created=CREATED),
            *(
                checkout_event(
                    recap,
                    f"checkout.session.async_payment_{outcome}",
                    session=session,
                    created=CREATED + 10 * n,
                )
                for n, outcome in enumerate(outcomes, start=1)
            ),
        ]

    return events


def test_an_asynchronous_payment_that_succeeds_pays_once(client):
    for order, recap, _ in arrive_in_every_order(client, asynchronous_payment("succeeded")):
        assert (recap.status, recap.payment_reference) == (
            RecapStatus.PAID,
            payment_intent_of(recap.checkout_session_id),
        ), order
        assert recap.awaiting_payment_reason == "" and render_rows(recap) == 1, order


def test_an_asynchronous_payment_that_fails_waits_for_payment_with_the_reason(client):
    for order, recap, _ in arrive_in_every_order(client, asynchronous_payment("failed")):
        assert recap.status == RecapStatus.PENDING_PAYMENT, order
        assert recap.awaiting_payment_reason.startswith(
            f"The asynchronous payment of checkout {recap.checkout_session_id} failed"
        ), order
        assert render_rows(recap) == 0, order


def test_a_failure_older_than_a_handled_success_is_superseded_in_every_order(client):
    events = asynchronous_payment("failed", "succeeded")
    orders = 0
    for order, recap, statuses in arrive_in_every_order(client, events):
        orders += 1
        assert (recap.status, recap.payment_reference) == (
            RecapStatus.PAID,
            payment_intent_of(recap.checkout_session_id),
        ), order
        assert recap.awaiting_payment_reason == "" and render_rows(recap) == 1, order
        # The success handled first: the older failure is recorded as superseded (by the
        # inbox: one handler, one ordering key for the session), never run.
        if order.index("async_payment_succeeded") < order.index("async_payment_failed"):
            assert statuses["async_payment_failed"] == "superseded", (order, statuses)
    assert orders == 6


def test_a_full_coupon_counts_as_paid_without_a_charge(client):
    def events(recap, session):
        return [
            checkout_event(
                recap,
                "checkout.session.completed",
                session=session,
                created=CREATED,
                payment_status="no_payment_required",
            )
        ]

    for _, recap, _ in arrive_in_every_order(client, events):
        assert recap.status == RecapStatus.PAID
        assert recap.payment_reference == recap.checkout_session_id  # no PaymentIntent
        assert render_rows(recap) == 1


def test_an_expired_checkout_closes_the_unpaid_recap(client):
    def events(recap, session):
        return [
            checkout_event(
                recap, "checkout.session.expired", session=session, created=CREATED + 86400
            )
        ]

    for _, recap, _ in arrive_in_every_order(client, events):
        assert recap.status == RecapStatus.CHECKOUT_EXPIRED
        assert recap.awaiting_payment_reason.startswith(
            f"Checkout {recap.checkout_session_id} expired unpaid"
        )
        assert render_rows(recap) == 0


def test_an_abandoned_checkout_expiring_does_nothing_to_the_checkout_that_paid(client):
    # The buyer left a first checkout open and paid a second one; the first expires later.
    def events(recap, session):
        return [
            checkout_event(
                recap, "checkout.session.expired", session=f"{session}_old", created=CREATED + 900
            ),
            checkout_event(
                recap,
                "checkout.session.completed",
                session=session,
                created=CREATED,
                payment_status="paid",
            ),
        ]

    for order, recap, _ in arrive_in_every_order(client, events):
        assert (recap.status, recap.payment_reference) == (
            RecapStatus.PAID,
            payment_intent_of(recap.checkout_session_id),
        ), order
        assert render_rows(recap) == 1, order


# --- the state machine on its own (called directly, no inbox ordering) ---------------------


def _apply(recap, event_type, *, created, **kwargs):
    event = checkout_event(
        recap, event_type, session=recap.checkout_session_id, created=created, **kwargs
    )
    record_checkout_session(STRIPE, event.to_dict())
    recap.refresh_from_db()


def test_a_newer_failure_before_the_render_withdraws_the_payment_and_its_render_row():
    recap = RecapFactory.create(checkout_session_id="cs_test_direct")
    _apply(recap, "checkout.session.async_payment_succeeded", created=CREATED + 10)
    assert recap.status == RecapStatus.PAID and render_rows(recap) == 1
    _apply(recap, "checkout.session.async_payment_failed", created=CREATED + 20)
    assert recap.status == RecapStatus.PENDING_PAYMENT and recap.paid_at is None
    assert recap.payment_reference == "" and recap.awaiting_payment_reason
    assert render_rows(recap) == 0  # nothing was sent: the row is withdrawn
    _apply(recap, "checkout.session.async_payment_succeeded", created=CREATED + 30)
    assert recap.status == RecapStatus.PAID and render_rows(recap) == 1  # a fresh row


def test_a_failure_after_the_render_was_requested_is_refused_and_changes_nothing():
    from ingress.handlers import PermanentHandlerError

    recap = RecapFactory.create(checkout_session_id="cs_test_claimed")
    _apply(recap, "checkout.session.async_payment_succeeded", created=CREATED + 10)
    side_effects_claim(limit=10)  # a dispatcher is asking the render service right now
    with pytest.raises(PermanentHandlerError) as refused:
        _apply(recap, "checkout.session.async_payment_failed", created=CREATED + 20)
    assert str(refused.value) == RECAP_RENDER_ALREADY_REQUESTED
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID
    assert recap.payment_reference == payment_intent_of("cs_test_claimed")
    assert RecapSideEffect.objects.get(recap=recap).status == SideEffectStatus.PROCESSING

    recap_mark_rendering(recap_id=recap.id, render_id="rnd_1")
    with pytest.raises(PermanentHandlerError) as too_late:
        _apply(recap, "checkout.session.async_payment_failed", created=CREATED + 20)
    assert str(too_late.value) == RECAP_PAYMENT_FAILED_TOO_LATE.format(status="rendering")


def test_an_expiry_does_nothing_to_a_paid_recap():
    recap = RecapFactory.create(checkout_session_id="cs_test_paid")
    _apply(recap, "checkout.session.completed", created=CREATED, payment_status="paid")
    _apply(recap, "checkout.session.expired", created=CREATED + 86400)
    assert recap.status == RecapStatus.PAID and recap.awaiting_payment_reason == ""


def test_a_new_checkout_reopens_an_expired_recap():
    from recaps.services import recap_checkout_attach

    recap = RecapFactory.create(checkout_session_id="cs_test_first")
    _apply(recap, "checkout.session.expired", created=CREATED)
    assert recap.status == RecapStatus.CHECKOUT_EXPIRED
    recap_checkout_attach(recap_id=recap.id, session_id="cs_test_second")
    recap.refresh_from_db()
    assert (recap.status, recap.checkout_session_id) == (
        RecapStatus.PENDING_PAYMENT,
        "cs_test_second",
    )
    assert recap.awaiting_payment_reason == "" and recap.checkout_event_at is None
