"""Stripe's checkout events for recaps (the render service's callbacks are outbox/handlers.py).
A handler runs inside the delivery's transaction and calls no other service over the network.
"""

import logging
import uuid
from datetime import UTC, datetime

from ingress.handlers import PermanentHandlerError, webhook_handler
from ingress.models import RawEvent
from recaps.errors import RecapNotFound, RecapStateConflict
from recaps.services import CheckoutEvent, CheckoutEventKind, checkout_event_apply

logger = logging.getLogger(__name__)

BAD_RECAP_ID = "recap id {value!r} in the event is not a UUID"


def recap_id_from_payload(value: object) -> uuid.UUID:
    """A recap id as our events carry it (Stripe's metadata, the render service's data)."""
    try:
        return uuid.UUID(str(value))
    except ValueError as exc:
        raise PermanentHandlerError(BAD_RECAP_ID.format(value=str(value)[:64])) from exc


CHECKOUT_EVENT_KINDS = {
    "checkout.session.async_payment_succeeded": CheckoutEventKind.PAID,
    "checkout.session.async_payment_failed": CheckoutEventKind.PAYMENT_FAILED,
    "checkout.session.expired": CheckoutEventKind.EXPIRED,
}
# checkout.session.completed pays when Stripe says so: `paid`, or `no_payment_required` (a
# 100 % coupon: paid without a charge). `unpaid` means an asynchronous payment method; its
# checkout.session.async_payment_succeeded (or _failed) follows.
PAID_AT_COMPLETION = ("paid", "no_payment_required")


def _created_at(event: RawEvent, payload: dict) -> datetime:
    """Stripe's `created` (Unix seconds); our receipt time if an event lacks it."""
    created = payload.get("created")
    if isinstance(created, int) and not isinstance(created, bool):
        return datetime.fromtimestamp(created, tz=UTC)
    return event.received_at


# One handler for every checkout.session.* event, so that the inbox's ordering (per handler
# and key: one session's events one at a time, never an older one after a newer one) covers
# all of them together; the decisions themselves are recaps.services.checkout_event_apply.
@webhook_handler(
    provider="stripe",
    event_types=["checkout.session.completed", *CHECKOUT_EVENT_KINDS],
    ordering_key="data.object.id",
    event_time="created",
)
def record_checkout_session(event: RawEvent, payload: dict) -> None:
    session = (payload.get("data") or {}).get("object") or {}
    recap_id = (session.get("metadata") or {}).get("recap_id")
    if not recap_id:
        # Some other product's checkout: not ours to handle.
        return
    event_type = payload.get("type")
    session_id = str(session.get("id") or "")
    if event_type == "checkout.session.completed":
        if session.get("payment_status") not in PAID_AT_COMPLETION:
            logger.info(
                "recaps.stripe.not_paid_yet",
                extra={"raw_event_id": event.id, "payment_status": session.get("payment_status")},
            )
            return
        kind = CheckoutEventKind.PAID
    else:
        kind = CHECKOUT_EVENT_KINDS[str(event_type)]
    # No PaymentIntent (no_payment_required): the session itself is the payment's reference.
    reference = ""
    if kind == CheckoutEventKind.PAID:
        reference = str(session.get("payment_intent") or session_id)
    try:
        outcome = checkout_event_apply(
            recap_id=recap_id_from_payload(recap_id),
            event=CheckoutEvent(
                kind=kind,
                session_id=session_id,
                created_at=_created_at(event, payload),
                payment_reference=reference,
                event_id=str(payload.get("id") or ""),
            ),
        )
    except (RecapNotFound, RecapStateConflict) as exc:
        # Unknown recap, a second payment for a paid one, a payment failing after the
        # render started: retrying cannot help, and the dead delivery shows up in the
        # console (a refund, a payment to chase).
        raise PermanentHandlerError(str(exc)) from exc
    logger.info(
        "recaps.stripe.checkout_event",
        extra={"raw_event_id": event.id, "kind": str(kind), "outcome": str(outcome)},
    )
