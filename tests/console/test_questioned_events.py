"""Questioned events in the console (issue 40): found by the status filter, the detail page
names the event it repeats and the next step, an operator answers through one audited
action (admin or API), the standby region refuses it, and /ops/ and /metrics count them."""

import json

import pytest
from django.test import Client
from django.urls import reverse

from console.models import OperatorAction
from console.ops.figures import ops_snapshot
from ingress.inbox import inbox_run_once
from ingress.models import RawEvent, SignatureQuestion
from tests.console.conftest import receive_github

pytestmark = pytest.mark.django_db

BODY = json.dumps({"action": "blocked", "blocked_user": {"login": "hacktocat"}}).encode()


@pytest.fixture
def questioned(push_handler) -> tuple[RawEvent, RawEvent]:
    """An event, and the same bytes under another delivery id: questioned."""
    original = receive_github(Client(), body=BODY, delivery="g-first")
    again = receive_github(Client(), body=BODY, delivery="g-again")
    inbox_run_once()
    again.refresh_from_db()
    assert again.signature_status == "questioned"
    return original, again


def status(event: RawEvent) -> tuple[str, str, str]:
    event.refresh_from_db()
    return event.signature_status, event.rejection_reason, event.dispatch_status


def test_the_list_filters_them_and_the_page_says_what_it_repeats(admin_client, questioned):
    original, again = questioned
    listing = admin_client.get(
        reverse("admin:ingress_rawevent_changelist") + "?signature_status__exact=questioned"
    ).content.decode()
    assert f"/admin/ingress/rawevent/{again.pk}/change/" in listing
    assert f"/admin/ingress/rawevent/{original.pk}/change/" not in listing
    page = admin_client.get(
        reverse("admin:ingress_rawevent_change", args=[again.pk])
    ).content.decode()
    assert f"github #{again.pk}: questioned: signature seen before" in page
    link = f'<a href="/admin/ingress/rawevent/{original.pk}/change/">#{original.pk}</a>'
    assert f"repeats {link}" in page
    assert "Questioned at" in page
    for button in ("console-accept-repeat", "console-reject-repeat"):
        assert f'id="{button}"' in page
    assert 'id="console-replay"' not in page and 'id="console-reverify"' not in page


def test_an_operator_accepts_one_from_the_admin_with_a_reason(admin_client, questioned):
    _, again = questioned
    changelist = reverse("admin:ingress_rawevent_changelist")
    form = {"action": "accept_repeat_selected", "_selected_action": str(again.pk)}
    confirmation = admin_client.post(changelist, form).content.decode()
    assert "This will touch 1 raw event." in confirmation
    refused = admin_client.post(changelist, {**form, "post": "yes"}).content.decode()
    assert "Give a reason" in refused and status(again)[0] == "questioned"
    admin_client.post(
        changelist, {**form, "post": "yes", "note": "a member was re-added: GitHub log"}
    )
    assert status(again) == ("pending", "", "waiting")  # handed to the inbox
    inbox_run_once()
    assert status(again) == ("verified", "", "dispatched")
    record = OperatorAction.objects.get()
    assert (record.action, record.via, record.succeeded, record.note) == (
        "raw_event_accept_repeat",
        "admin",
        1,
        "a member was re-added: GitHub log",
    )
    question = SignatureQuestion.objects.get(pk=again.pk)
    assert (question.answer, question.answered_by, question.evidence) == (
        "genuine",
        "operator",
        "a member was re-added: GitHub log",
    )


def test_an_operator_rejects_them_through_the_api(client, operator, questioned, push_handler):
    original, again = questioned
    client.force_login(operator)
    url = "/api/raw-events/reject-repeat/"
    missing_reason = client.post(url, {"ids": [again.pk]}, content_type="application/json")
    assert missing_reason.status_code == 400
    answer = client.post(
        url,
        {"ids": [again.pk, original.pk], "reason": "not in GitHub's log"},
        content_type="application/json",
    )
    assert answer.status_code == 200
    data = answer.json()
    assert (data["action"], data["succeeded"], data["refused"]) == ("raw_event_reject_repeat", 1, 1)
    assert "not questioned" in data["results"][1]["detail"]  # the original: verified
    assert status(again) == ("rejected", "replayed_signature", "not_dispatched")
    detail = client.get(f"/api/raw-events/{again.pk}/").json()
    assert detail["signature_question"]["repeats"] == original.pk
    assert detail["signature_question"]["answer"] == "replayed"
    assert client.get(f"/api/raw-events/{original.pk}/").json()["signature_question"] is None
    listed = client.get("/api/raw-events/?status=questioned").json()["results"]
    assert listed == []
    assert push_handler.calls == [original.pk]


def test_the_ops_page_and_metrics_count_them(admin_client, questioned, settings):
    snapshot = ops_snapshot()
    assert snapshot.inbox["raw_events_questioned"] == 1
    assert snapshot.inbox["raw_events_oldest_questioned_age_seconds"] >= 0
    page = admin_client.get("/ops/").content.decode()
    assert 'id="queue-raw-events-questioned"' in page
    assert 'id="slo-raw_events_oldest_questioned_age"' in page
    settings.METRICS_BEARER_TOKEN = "questioned-metrics-token-0123456789"
    scrape = (
        Client()
        .get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.METRICS_BEARER_TOKEN}")
        .content.decode()
    )
    assert "eventdrop_raw_events_questioned 1.0" in scrape
    labels = '{signature_status="questioned",source="github"}'
    assert f"eventdrop_raw_events_received_last_24h{labels} 1.0" in scrape
