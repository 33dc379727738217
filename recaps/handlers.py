"""Webhook handlers for recaps (registered with ingress; run by the inbox worker).

Both handlers are thin: they read what they need from the payload and call a service. They
run inside the delivery's transaction (ingress/inbox.py), so the recap's new status, its
outbox row and the delivery's `done` commit together or not at all. Nothing here calls
another service over the network: that is the outbox dispatcher's job, on its own budget.

The render service's callback (source `renderer`, Standard Webhooks), which we define:

    {"type": "render.completed", "timestamp": "<ISO 8601>",
     "data": {"recap_id": "<uuid>", "render_id": "…", "idempotency_key": "…",
              "video_url": "https://…"}}
    {"type": "render.failed", "timestamp": "<ISO 8601>",
     "data": {"recap_id": "<uuid>", "render_id": "…", "idempotency_key": "…",
              "error": {"code": "…", "message": "…"}}}

`render.failed` means the service gave up on the render for good (it retries its own
transient problems); the recap becomes `failed`, visibly, and staff can retry it.
"""

import logging
import uuid

from django.conf import settings

from ingress.handlers import PermanentHandlerError, webhook_handler
from ingress.models import RawEvent
from recaps.errors import RecapNotFound, RecapStateConflict
from recaps.services import recap_mark_paid, recap_mark_ready, recap_mark_render_failed

logger = logging.getLogger(__name__)

BAD_RECAP_ID = "recap id {value!r} in the event is not a UUID"
NO_VIDEO_URL = "render.completed without data.video_url"
RENDER_FAILED_REASON = "render failed: {code}: {message}"


def _recap_id(value: object) -> uuid.UUID:
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
        recap_mark_paid(recap_id=_recap_id(recap_id), payment_reference=str(reference))
    except (RecapNotFound, RecapStateConflict) as exc:
        # Unknown recap, or a second payment for a paid one: retrying cannot help, and the
        # dead delivery shows up in the console for a refund.
        raise PermanentHandlerError(str(exc)) from exc


@webhook_handler(provider="standard", event_types=["render.completed", "render.failed"])
def record_render_result(event: RawEvent, payload: dict) -> None:
    if event.source != settings.RENDER_WEBHOOK_SOURCE:
        return  # another Standard Webhooks sender using the same event names
    data = payload.get("data") or {}
    recap_id = _recap_id(data.get("recap_id"))
    try:
        if payload.get("type") == "render.completed":
            video_url = data.get("video_url")
            if not video_url:
                raise PermanentHandlerError(NO_VIDEO_URL)
            recap_mark_ready(
                recap_id=recap_id,
                video_url=str(video_url),
                render_id=str(data.get("render_id", "")),
            )
        else:
            error = data.get("error") or {}
            recap_mark_render_failed(
                recap_id=recap_id,
                idempotency_key=str(data.get("idempotency_key", "")),
                reason=RENDER_FAILED_REASON.format(
                    code=str(error.get("code", "unknown"))[:64],
                    message=str(error.get("message", ""))[:500],
                ),
            )
    except (RecapNotFound, RecapStateConflict) as exc:
        raise PermanentHandlerError(str(exc)) from exc
