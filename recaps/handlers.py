"""Webhook handlers for recaps (registered with ingress; run by the inbox worker): Stripe's
checkout events. The render service's callbacks are the outbox's (outbox/handlers.py).

The handler is thin: it reads what it needs from the payload and calls a service. It runs
inside the delivery's transaction (ingress/inbox.py), so the recap's new status, its outbox
row and the delivery's `done` commit together or not at all. Nothing here calls another
service over the network: that is the outbox dispatcher's job, on its own budget.
"""

import logging
import uuid

from ingress.handlers import PermanentHandlerError, webhook_handler
from ingress.models import RawEvent
from recaps.errors import RecapNotFound, RecapStateConflict
from recaps.services import recap_mark_paid

logger = logging.getLogger(__name__)

BAD_RECAP_ID = "recap id {value!r} in the event is not a UUID"


def recap_id_from_payload(value: object) -> uuid.UUID:
    """A recap id as our events carry it (Stripe's metadata, the render service's data)."""
    try:
        return uuid.UUID(str(value))
    except ValueError as exc:
        raise PermanentHandlerError(BAD_RECAP_ID.format(value=str(value)[:64])) from exc


@webhook_handler(
    provider="stripe",
    event_types=["checkout.session.completed", "checkout.session.async_payment_succeeded"],
)
def mark_recap_paid(event: RawEvent, payload: dict) -> None:
    session = (payload.get("data") or {}).get("object") or {}
    recap_id = (session.get("metadata") or {}).get("recap_id")
    if not recap_id:
        # Some other product's checkout: not ours to handle.
        return
    if session.get("payment_status") != "paid":
        # Asynchronous payment methods complete the session before the money arrives;
        # `checkout.session.async_payment_succeeded` follows when (if) it does.
        logger.info(
            "recaps.stripe.not_paid_yet",
            extra={"raw_event_id": event.id, "payment_status": session.get("payment_status")},
        )
        return
    reference = session.get("payment_intent") or session.get("id") or ""
    try:
        recap_mark_paid(recap_id=recap_id_from_payload(recap_id), payment_reference=str(reference))
    except (RecapNotFound, RecapStateConflict) as exc:
        # Unknown recap, or a second payment for a paid one: retrying cannot help, and the
        # dead delivery shows up in the console for a refund.
        raise PermanentHandlerError(str(exc)) from exc
