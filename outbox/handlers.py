"""The render service's callbacks (source `renderer`, Standard Webhooks), which we define:

    {"type": "render.completed", "timestamp": "<ISO 8601>",
     "data": {"recap_id": "<uuid>", "render_id": "…", "idempotency_key": "…",
              "video_url": "https://…"}}
    {"type": "render.failed", "timestamp": "<ISO 8601>",
     "data": {"recap_id": "<uuid>", "render_id": "…", "idempotency_key": "…",
              "error": {"code": "…", "message": "…"}}}

Here, beside the render client and the status checks (outbox/render_status.py), because the
outbox owns the render service: it asks for the render, and it hears the answer, whether
pushed (this callback) or pulled (a status check), through the same services.

`render.failed` means the service gave up on the render for good (it retries its own
transient problems): a verdict, so the recap becomes `failed`, visibly, and staff can retry
it. Either callback is matched to the render it answers (its render id and idempotency
key): one about a render that is not the recap's current one is ignored, and the handler
returns the note the console shows on the event ("stale callback for render …"). One about
a recap still unpaid here is retried (RenderCallbackBeforePayment): this database has not
handled the payment yet, which is no verdict about the callback. The
handler runs inside the delivery's transaction (ingress/deliveries/).
"""

from django.conf import settings

from ingress.handlers import PermanentHandlerError, webhook_handler
from ingress.models import RawEvent
from kernel import tracing
from outbox.services import render_completed_record, render_failed_record
from recaps.errors import RecapNotFound, RecapStateConflict
from recaps.handlers import recap_id_from_payload
from recaps.models import RecapId

NO_VIDEO_URL = "render.completed without data.video_url"
RENDER_FAILED_REASON = "render failed: {code}: {message}"


@webhook_handler(provider="standard", event_types=["render.completed", "render.failed"])
def record_render_result(event: RawEvent, payload: dict) -> str | None:
    """Returns the line the console shows on the event's delivery when the callback was
    not about the recap's current render ("stale callback for render …")."""
    if event.source != settings.RENDER_WEBHOOK_SOURCE:
        return None  # another Standard Webhooks sender using the same event names
    data = payload.get("data") or {}
    recap_id = recap_id_from_payload(data.get("recap_id"))
    render_id = str(data.get("render_id") or "")
    idempotency_key = str(data.get("idempotency_key") or "")
    with tracing.span(
        "recap ready" if payload.get("type") == "render.completed" else "recap render failed",
        attributes={"eventdrop.recap_id": str(recap_id), "eventdrop.render_id": render_id},
    ):
        return _record(payload, data, recap_id, render_id, idempotency_key)


def _record(
    payload: dict, data: dict, recap_id: RecapId, render_id: str, idempotency_key: str
) -> str | None:
    try:
        if payload.get("type") == "render.completed":
            video_url = data.get("video_url")
            if not video_url:
                raise PermanentHandlerError(NO_VIDEO_URL)
            result = render_completed_record(
                recap_id=recap_id,
                video_url=str(video_url),
                render_id=render_id,
                idempotency_key=idempotency_key,
            )
        else:
            error = data.get("error") or {}
            result = render_failed_record(
                recap_id=recap_id,
                render_id=render_id,
                idempotency_key=idempotency_key,
                reason=RENDER_FAILED_REASON.format(
                    code=str(error.get("code", "unknown"))[:64],
                    message=str(error.get("message", ""))[:500],
                ),
            )
    except (RecapNotFound, RecapStateConflict) as exc:
        raise PermanentHandlerError(str(exc)) from exc
    return result.stale or None
