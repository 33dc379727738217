"""The render service's callbacks (outbox/handlers.py), called directly."""

import uuid

import pytest

from ingress.handlers import PermanentHandlerError, handlers_for
from ingress.models import RawEvent
from kernel.errors import Disposition
from kernel.retry import classify
from outbox.errors import RenderCallbackBeforePayment
from outbox.handlers import NO_VIDEO_URL, record_render_result
from outbox.models import RecapSideEffect
from outbox.services import recap_retry_render, render_completed_record
from recaps.errors import RECAP_NOT_FOUND
from recaps.models import RecapStatus
from recaps.services import recap_mark_rendering
from tests.recaps.factories import RecapFactory
from tests.recaps.fixtures import T0, pay

pytestmark = pytest.mark.django_db

RENDERER = RawEvent(id=2, source="renderer", provider="standard")


def test_the_handler_is_registered_for_its_events():
    for event_type in ("render.completed", "render.failed"):
        assert [s.name for s in handlers_for("standard", event_type)] == [
            "outbox.handlers.record_render_result"
        ]


def render_event(recap, kind="completed", **data):
    side_effect = RecapSideEffect.objects.filter(recap=recap).first()
    body = {
        "recap_id": str(recap.id),
        "render_id": "rnd_1",
        "idempotency_key": side_effect.idempotency_key if side_effect else "",
        **data,
    }
    if kind == "completed":
        body.setdefault("video_url", "https://videos.example/rnd_1.mp4")
    else:
        body.setdefault("error", {"code": "photos_unreadable", "message": "no photo decoded"})
    return {"type": f"render.{kind}", "timestamp": "2026-06-01T12:00:00Z", "data": body}


def rendering_recap(render_id="rnd_1"):
    recap = RecapFactory.create()
    pay(recap, now=T0)
    recap_mark_rendering(recap_id=recap.id, render_id=render_id, now=T0)
    return recap


def test_completed_marks_the_recap_ready_with_its_video():
    recap = rendering_recap()
    record_render_result(RENDERER, render_event(recap))
    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY
    assert recap.video_url == "https://videos.example/rnd_1.mp4"


def test_duplicate_and_late_callbacks_are_harmless():
    recap = rendering_recap()
    record_render_result(RENDERER, render_event(recap))
    recap.refresh_from_db()
    ready_at = recap.ready_at
    record_render_result(RENDERER, render_event(recap, video_url="https://other/x.mp4"))
    record_render_result(RENDERER, render_event(recap, kind="failed"))
    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY and recap.ready_at == ready_at
    assert recap.video_url == "https://videos.example/rnd_1.mp4"


def test_failed_marks_the_recap_failed_with_the_services_reason():
    recap = rendering_recap()
    record_render_result(RENDERER, render_event(recap, kind="failed"))
    recap.refresh_from_db()
    assert recap.status == RecapStatus.FAILED
    assert recap.failure_reason == "render failed: photos_unreadable: no photo decoded"


def test_a_failure_of_an_older_render_is_ignored():
    recap = rendering_recap()
    record_render_result(RENDERER, render_event(recap, kind="failed", idempotency_key="old"))
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING


def test_a_late_completion_rescues_a_failed_recap():
    recap = rendering_recap()
    record_render_result(RENDERER, render_event(recap, kind="failed"))
    record_render_result(RENDERER, render_event(recap))
    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY and recap.failure_reason == ""


def test_a_callback_before_the_payment_is_retried_and_applies_once_the_payment_is_handled():
    """In another region the payment was handled and the render done; here (processing moved
    after a melt) the callback's delivery can run before the payment's: no verdict, so the
    delivery is retried — classified transient, never dead at once — and applies after."""
    recap = RecapFactory.create()
    payload = render_event(recap)  # the render row's key, as the other region sent it
    with pytest.raises(RenderCallbackBeforePayment) as exc:
        record_render_result(RENDERER, payload)
    assert classify(exc.value).disposition == Disposition.TRANSIENT
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PENDING_PAYMENT
    side_effect = pay(recap, now=T0)
    payload["data"]["idempotency_key"] = side_effect.idempotency_key
    record_render_result(RENDERER, payload)
    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY


def test_a_callback_for_an_unknown_recap_is_permanent():
    payload = {
        "type": "render.completed",
        "data": {"recap_id": str(uuid.uuid4()), "video_url": "https://v/x.mp4"},
    }
    with pytest.raises(PermanentHandlerError) as exc:
        record_render_result(RENDERER, payload)
    assert str(exc.value) == RECAP_NOT_FOUND


def test_a_completion_without_a_video_is_permanent():
    recap = rendering_recap()
    with pytest.raises(PermanentHandlerError) as exc:
        record_render_result(RENDERER, render_event(recap, video_url=""))
    assert str(exc.value) == NO_VIDEO_URL


def test_another_standard_webhooks_source_is_ignored():
    recap = rendering_recap()
    other = RawEvent(id=3, source="acme", provider="standard")
    record_render_result(other, render_event(recap))
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING


def test_ready_settles_a_row_still_waiting():
    recap = RecapFactory.create()
    side_effect = pay(recap, now=T0)
    render_completed_record(
        recap_id=recap.id,
        video_url="https://v/x.mp4",
        render_id="rnd_1",
        idempotency_key=side_effect.idempotency_key,
    )
    side_effect.refresh_from_db()
    assert side_effect.status == "done"


# --- callbacks are matched to the render they answer (issue 27, finding 3) --------------------


def retried_after_a_failure():
    """The recap's render rnd_0 (key g0) failed; an operator asked for a new one (g1)."""
    recap = rendering_recap(render_id="rnd_0")
    record_render_result(RENDERER, render_event(recap, kind="failed", render_id="rnd_0"))
    old_key = RecapSideEffect.objects.get(recap=recap).idempotency_key
    RecapSideEffect.objects.filter(recap=recap).update(status="done")
    recap_retry_render(recap=recap)
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID
    return recap, old_key


def test_a_late_completion_of_the_old_render_before_the_new_one_is_ignored_and_said_so():
    recap, old_key = retried_after_a_failure()
    note = record_render_result(
        RENDERER, render_event(recap, render_id="rnd_0", idempotency_key=old_key)
    )
    row = RecapSideEffect.objects.get(recap=recap)
    assert note == (
        f"stale callback for render rnd_0 (completed): the recap's current render is "
        f"{row.idempotency_key}; ignored"
    )
    recap.refresh_from_db()
    # Before: ready with the old video, and the new render's row settled `done`, so the
    # new render was never requested.
    assert recap.status == RecapStatus.PAID and recap.video_url == ""
    assert row.status == "pending" and row.key_generation == 1
    # The new render's own completion is taken.
    assert record_render_result(RENDERER, render_event(recap, render_id="rnd_1")) is None
    recap.refresh_from_db()
    assert recap.status == RecapStatus.READY
    assert recap.video_url == "https://videos.example/rnd_1.mp4"


def test_a_late_completion_of_the_old_render_after_the_new_one_is_ignored_and_said_so():
    recap, old_key = retried_after_a_failure()
    RecapSideEffect.objects.filter(recap=recap).update(status="done")
    recap_mark_rendering(recap_id=recap.id, render_id="rnd_1", now=T0)
    record_render_result(RENDERER, render_event(recap, render_id="rnd_1"))
    note = record_render_result(
        RENDERER,
        render_event(
            recap, render_id="rnd_0", idempotency_key=old_key, video_url="https://old/0.mp4"
        ),
    )
    assert note == (
        "stale callback for render rnd_0 (completed): the recap's current render is rnd_1; ignored"
    )
    recap.refresh_from_db()
    assert (recap.status, recap.render_id) == (RecapStatus.READY, "rnd_1")
    assert recap.video_url == "https://videos.example/rnd_1.mp4"


def test_a_failure_of_another_render_under_the_same_key_is_ignored():
    # The service lost rnd_1 and accepted the same key anew as rnd_2 (render_lost_resend):
    # a late word about rnd_1 is not about the render the recap waits for.
    recap = rendering_recap()
    RecapSideEffect.objects.filter(recap=recap).update(status="done")
    from recaps.models import RecapVideo

    RecapVideo.objects.filter(pk=recap.pk).update(render_id="rnd_2")
    note = record_render_result(RENDERER, render_event(recap, kind="failed", render_id="rnd_1"))
    assert note == (
        "stale callback for render rnd_1 (failed): the recap's current render is rnd_2; ignored"
    )
    recap.refresh_from_db()
    assert recap.status == RecapStatus.RENDERING
