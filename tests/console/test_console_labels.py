"""The console reads at a glance: titles and labels say what happened, every failure state
names its next step, statuses are coloured words, times go to the second, and the detail
pages carry the list's actions (same services, permissions and audit)."""

import re

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from console.models import OperatorAction
from console.raw_events.admin import (
    NEXT_BODY,
    NEXT_CHECK_SENDER,
    NEXT_CLOCK,
    NEXT_DEAD,
    NEXT_DUPLICATE,
    NEXT_FIX_SIGNING_KEY,
    NEXT_HELD,
    NEXT_IN_PROGRESS,
    NEXT_NO_HANDLER,
    NEXT_NONE,
    NEXT_QUESTIONED,
    NEXT_REPLAYED,
    NEXT_WAIT_VERIFY,
    RawEventAdmin,
    raw_event_state,
)
from ingress.inbox import inbox_run_once
from ingress.models import Delivery, RawEvent
from outbox.models import RecapSideEffect
from tests.console.conftest import receive_github

pytestmark = pytest.mark.django_db


def event(**fields) -> RawEvent:
    defaults = {"source": "github", "provider": "github", "signature_status": "verified"}
    return RawEvent(pk=7, **{**defaults, **fields})


@pytest.mark.parametrize(
    ("fields", "deliveries", "headline", "tone", "step"),
    [
        ({"signature_status": "pending", "dispatch_status": "waiting"}, [],
         "waiting for verification", "wait", NEXT_WAIT_VERIFY),
        ({"signature_status": "questioned", "dispatch_status": "waiting"}, [],
         "questioned: signature seen before", "warn", NEXT_QUESTIONED),
        ({"signature_status": "rejected", "rejection_reason": "replayed_signature"}, [],
         "rejected: replayed_signature", "bad", NEXT_REPLAYED),
        ({"signature_status": "rejected", "rejection_reason": "bad_signature"}, [],
         "rejected: bad_signature", "bad", NEXT_FIX_SIGNING_KEY),
        ({"signature_status": "rejected", "rejection_reason": "no_secret_configured"}, [],
         "rejected: no_secret_configured", "bad", NEXT_FIX_SIGNING_KEY),
        ({"signature_status": "rejected", "rejection_reason": "missing_signature"}, [],
         "rejected: missing_signature", "bad", NEXT_CHECK_SENDER),
        ({"signature_status": "rejected", "rejection_reason": "stale_timestamp"}, [],
         "rejected: stale_timestamp", "bad", NEXT_CLOCK),
        ({"signature_status": "rejected", "rejection_reason": "unparseable_body"}, [],
         "rejected: unparseable_body", "bad", NEXT_BODY),
        ({"dispatch_status": "duplicate", "duplicate_of_id": 3}, [],
         "verified, duplicate of #3", "quiet", NEXT_DUPLICATE),
        ({"dispatch_status": "no_handler", "event_type": "push"}, [],
         "verified, no handler", "warn", NEXT_NO_HANDLER),
        ({"dispatch_status": "dispatched"}, ["done", "dead"],
         "verified, delivery dead", "bad", NEXT_DEAD),
        ({"dispatch_status": "dispatched"}, ["done", "pending"],
         "verified, deliveries running", "wait", NEXT_IN_PROGRESS),
        ({"dispatch_status": "dispatched"}, ["done", "held"],
         "verified, delivery held", "warn", NEXT_HELD),
        ({"dispatch_status": "dispatched"}, ["held", "held", "pending"],
         "verified, deliveries held", "warn", NEXT_HELD),
        ({"dispatch_status": "dispatched"}, ["done"], "verified, handled", "ok", NEXT_NONE),
    ],
)  # fmt: skip
def test_each_state_has_a_headline_a_tone_and_its_one_next_step(
    fields, deliveries, headline, tone, step
):
    state = raw_event_state(event(**fields), deliveries)
    assert (state.headline, state.tone) == (headline, tone)
    # The template's fixed words are in the step (its placeholders filled in).
    assert state.next_step.startswith(step.split("{")[0])
    assert "{" not in state.next_step


def test_the_status_columns_come_first_in_the_list():
    assert RawEventAdmin.list_display[1:5] == (
        "signature_badge",
        "reason_column",
        "dispatch_badge",
        "age",
    )


def detail(client, raw_event) -> str:
    return client.get(
        reverse("admin:ingress_rawevent_change", args=[raw_event.pk])
    ).content.decode()


def test_a_rejected_event_says_rejected_at_and_to_fix_the_secret_then_reverify(admin_client):
    rejected = receive_github(Client(), delivery="bad-sig", secret="not-the-configured-secret")
    inbox_run_once()
    page = detail(admin_client, rejected)
    assert "Rejected at" in page and "Verified at" not in page
    assert f"github #{rejected.pk}: rejected: bad_signature" in page
    assert "then Re-verify this event" in page
    assert 'id="console-reverify"' in page
    # To the second, and how long ago.
    text = re.sub(r"<[^>]+>", "", page)  # the words shown, without the markup between them
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC · [\d.]+ (ms|s) ago", text)
    assert 'class="console-badge console-tone-bad">rejected' in page


def test_a_dead_delivery_is_in_the_title_and_the_next_step_is_replay(
    admin_client, push_handler, settings
):
    settings.DELIVERY_MAX_ATTEMPTS = 1
    settings.DELIVERY_TRANSIENT_HORIZON_SECONDS = 0  # the finality rule: attempts and horizon
    push_handler.fail_with = RuntimeError("handler broke")
    raw = receive_github(Client(), delivery="dies")
    inbox_run_once()
    assert Delivery.objects.get(raw_event=raw).status == "dead"
    page = detail(admin_client, raw)
    assert f"github #{raw.pk}: verified, delivery dead" in page
    assert "(verified)" not in page
    assert "then Replay this event" in page
    assert "No deliveries" not in page


def test_an_event_without_handler_names_why_and_what_to_do(admin_client):
    raw = receive_github(Client(), delivery="lonely", event="star")
    inbox_run_once()
    page = detail(admin_client, raw)
    assert "No deliveries: verified, no handler." in page
    assert "No handler was registered for “star” when it arrived" in page


def side_effect_page(client, row) -> str:
    url = reverse("admin:outbox_recapsideeffect_change", args=[row.pk])
    return client.get(url).content.decode()


def test_a_dead_side_effect_shows_no_next_attempt_and_offers_rearm(admin_client, dead_side_effect):
    page = side_effect_page(admin_client, dead_side_effect)
    field = re.search(r'<div class="form-row field-next_attempt">.*?</div>\s*</div>', page, re.S)
    assert field is not None
    assert "none: dead (re-arm to try again)" in field.group(0)
    assert not re.search(r"\d\d:\d\d:\d\d", field.group(0))
    for button in ("console-rearm", "console-retry-render"):
        assert f'id="{button}"' in page
    assert 'id="console-mark-dead"' not in page  # already dead


def test_the_rearm_button_runs_the_list_action_with_its_confirmation_and_audit(
    admin_client, dead_side_effect
):
    detail_url = reverse("admin:outbox_recapsideeffect_change", args=[dead_side_effect.pk])
    form = {
        "action": "rearm_selected",
        "_selected_action": str(dead_side_effect.pk),
        "next": detail_url,
    }
    changelist = reverse("admin:outbox_recapsideeffect_changelist")
    confirmation = admin_client.post(changelist, form).content.decode()
    assert "This will touch 1 recap side effect." in confirmation
    assert RecapSideEffect.objects.get(pk=dead_side_effect.pk).status == "dead"
    done = admin_client.post(changelist, {**form, "post": "yes"})
    assert done.status_code == 302 and done["Location"] == detail_url
    assert RecapSideEffect.objects.get(pk=dead_side_effect.pk).status == "pending"
    record = OperatorAction.objects.get()
    assert (record.action, record.via, record.succeeded) == ("side_effect_rearm", "admin", 1)


def test_the_buttons_are_only_for_those_who_may_operate(
    client, django_user_model, dead_side_effect
):
    from tests.console.conftest import grant

    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    client.force_login(grant(viewer, "outbox.view_recapsideeffect"))
    page = side_effect_page(client, dead_side_effect)
    assert "none: dead" in page
    assert 'id="console-rearm"' not in page and 'id="console-retry-render"' not in page


def test_the_recap_page_shows_no_next_attempt_for_its_dead_render(admin_client, dead_side_effect):
    url = reverse("admin:recaps_recapvideo_change", args=[dead_side_effect.recap_id])
    page = admin_client.get(url).content.decode()
    cell = re.search(r'<td class="field-next_attempt">(.*?)</td>', page, re.S)
    assert cell is not None
    assert "none: dead" in cell.group(1)
    assert not re.search(r"\d\d:\d\d:\d\d", cell.group(1))


def test_a_dead_delivery_shows_no_next_attempt_and_says_what_to_do(
    admin_client, push_handler, settings
):
    settings.DELIVERY_MAX_ATTEMPTS = 1
    settings.DELIVERY_TRANSIENT_HORIZON_SECONDS = 0  # the finality rule: attempts and horizon
    push_handler.fail_with = RuntimeError("handler broke")
    raw = receive_github(Client(), delivery="dies-too")
    inbox_run_once()
    delivery = Delivery.objects.get(raw_event=raw)
    page = admin_client.get(
        reverse("admin:ingress_delivery_change", args=[delivery.pk])
    ).content.decode()
    field = re.search(r'<div class="form-row field-next_attempt">.*?</div>\s*</div>', page, re.S)
    assert field is not None
    assert "none: dead (fix the cause, then Replay its event)" in field.group(0)
    listing = admin_client.get(reverse("admin:ingress_delivery_changelist")).content.decode()
    assert 'class="console-badge console-tone-bad">dead' in listing


def test_a_held_event_says_which_pause_holds_it_who_paused_and_how_to_resume(
    client, admin_user, push_handler
):
    from console.pauses.services import handlers_pause
    from fakes.management.commands.demo import held_hint
    from recaps.models import RecapStatus, RecapVideo

    handler = "tests.console.conftest.push_handler.<locals>.console_test_on_push"
    handlers_pause(actor=admin_user, via="admin", handler=handler, reason="CRM down")
    event = receive_github(client, {"ref": "refs/heads/main"}, delivery="held-1")
    inbox_run_once()
    inbox_run_once()  # the due delivery is found paused and held
    assert Delivery.objects.get(raw_event=event).status == "held"
    client.force_login(admin_user)
    page = client.get(f"/admin/ingress/rawevent/{event.pk}/change/").content.decode()
    assert f"github #{event.pk}: verified, delivery held" in page
    assert escape(f"handler {handler} (by admin since") in page
    assert "/ops/pauses/" in page
    assert NEXT_NONE not in page
    # manage.py demo's diagnosis: a paused payment handler, not a missing inbox worker.
    recap = RecapVideo(status=RecapStatus.PENDING_PAYMENT)
    assert held_hint(recap) == ""
    handlers_pause(
        actor=admin_user,
        via="admin",
        handler="recaps.handlers.record_checkout_session",
        reason="Stripe incident",
    )
    assert "held: handler recaps.handlers.record_checkout_session paused" in held_hint(recap)


def test_actions_are_offered_only_where_they_can_succeed(client, admin_user, push_handler):
    rejected = receive_github(client, {"zen": "x"}, delivery="forged", secret="wrong")
    verified = receive_github(client, {"zen": "y"}, delivery="good")
    inbox_run_once()
    client.force_login(admin_user)
    page = client.get(f"/admin/ingress/rawevent/{rejected.pk}/change/").content.decode()
    # Replay is always refused on a rejected event: not offered; Re-verify is.
    assert 'id="console-reverify"' in page and 'id="console-replay"' not in page
    page = client.get(f"/admin/ingress/rawevent/{verified.pk}/change/").content.decode()
    assert 'id="console-replay"' in page and 'id="console-reverify"' not in page


def test_one_time_format_and_one_empty_marker_on_the_lists(client, admin_user, push_handler):
    receive_github(client, {"zen": "y"}, delivery="good")
    inbox_run_once()
    client.force_login(admin_user)
    for path in (
        "/admin/ingress/rawevent/",
        "/admin/ingress/delivery/",
        "/admin/console/operatoraction/",
        "/admin/outbox/recapsideeffect/",
        "/admin/recaps/recapvideo/",
    ):
        page = client.get(path).content.decode()
        assert ' class="empty"' not in page or "—" in page, path
        # No Django default formats ("Dec. 3, 2026, 7:13 p.m."), no "-" for empty values.
        assert " p.m." not in page and " a.m." not in page, path
        assert '<td class="field-' not in page or ">-</td>" not in page, path
    rows = client.get("/admin/ingress/rawevent/").content.decode()
    shown = re.sub(r"<[^>]+>", "", rows)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC · [\d.]+ (ms|s) ago", shown)
