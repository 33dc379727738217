"""The console API: same data and rules as the admin; bad input is a 4xx, never a 500."""

import base64

import pytest
from rest_framework.test import APIClient

from console.models import OperatorAction
from ingress.inbox import inbox_run_once
from ingress.models import RawEvent
from ingress.services import REPLAY_NOT_VERIFIED
from tests.console.conftest import receive_github

pytestmark = pytest.mark.django_db

LIST = "/api/raw-events/"
REPLAY = "/api/raw-events/replay/"
REVERIFY = "/api/raw-events/reverify/"


@pytest.fixture
def api():
    return APIClient()


def as_user(api, user):
    api.force_authenticate(user)
    return api


@pytest.fixture
def events(client, push_handler):
    good = receive_github(client, {"ref": "refs/heads/main", "note": "findme"}, delivery="g-1")
    bad = receive_github(client, delivery="b-1", secret="wrong")
    inbox_run_once()
    return good, bad


# --- who may do what -----------------------------------------------------------------------


# Who may call what: the table in test_api_access.py, with real credentials.


def test_staff_without_payload_permission_gets_no_body_or_headers(api, operator, events):
    good, _ = events
    as_user(api, operator)
    listing = api.get(LIST).json()
    assert len(listing["results"]) == 2 and listing["next"] is None
    assert all("body" not in row and "headers" not in row for row in listing["results"])
    detail = api.get(f"/api/raw-events/{good.pk}/").json()
    assert "body" not in detail and "headers" not in detail
    assert detail["signature_status"] == "verified"
    assert api.get(LIST, {"include_payload": "true"}).status_code == 403
    assert api.get(LIST, {"body_contains": "findme"}).status_code == 403
    # A free-text query does not search bodies for them either.
    assert api.get(LIST, {"q": "findme"}).json()["results"] == []


def test_payload_permission_shows_exact_body_and_headers(api, payload_operator, client):
    body = b"\xffnot utf-8"
    event = RawEvent.objects.create(
        source="github",
        provider="github",
        method="POST",
        path="/webhooks/github/",
        headers={"x-github-event": "push"},
        body=body,
        body_sha256="0" * 64,
    )
    as_user(api, payload_operator)
    detail = api.get(f"/api/raw-events/{event.pk}/").json()
    assert detail["headers"] == {"x-github-event": "push"}
    assert detail["body"]["encoding"] == "base64"
    assert base64.b64decode(detail["body"]["data"]) == body
    listing = api.get(LIST, {"include_payload": "1"}).json()
    assert listing["results"][0]["body"]["size"] == len(body)


def test_actions_need_the_operate_permission(api, django_user_model, events):
    from tests.console.conftest import grant

    viewer = grant(
        django_user_model.objects.create_user("viewer", is_staff=True), "ingress.view_rawevent"
    )
    as_user(api, viewer)
    assert api.get(LIST).status_code == 200
    assert api.post(REPLAY, {"ids": [events[0].pk]}, format="json").status_code == 403
    assert not OperatorAction.objects.exists()


# --- reads ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "which"),
    [
        ({"status": "rejected"}, {"bad"}),
        ({"status": "verified", "source": "github"}, {"good"}),
        ({"reason": "bad_signature"}, {"bad"}),
        ({"dispatch_status": "dispatched"}, {"good"}),
        ({"delivery_id": "g-1"}, {"good"}),
        ({"source": "stripe"}, set()),
        ({"received_after": "2000-01-01T00:00:00Z"}, {"good", "bad"}),
        ({"received_before": "2000-01-01T00:00:00Z"}, set()),
        ({"q": "b-1"}, {"bad"}),
        ({"body_contains": "findme"}, {"good"}),
        ({"q": "findme"}, set()),  # ids and keys only: bodies need body_contains
    ],
)
def test_list_filters(api, payload_operator, events, params, which):
    good, bad = events
    as_user(api, payload_operator)
    response = api.get(LIST, params)
    assert response.status_code == 200, response.content
    ids = {row["id"] for row in response.json()["results"]}
    assert ids == {{"good": good.pk, "bad": bad.pk}[name] for name in which}


def test_detail_has_deliveries_and_attempts(api, operator, events):
    good, _ = events
    as_user(api, operator)
    detail = api.get(f"/api/raw-events/{good.pk}/").json()
    assert detail["dedup_key"] == "id:g-1"
    assert detail["verify_lag_seconds"] >= 0
    [delivery] = detail["deliveries"]
    assert delivery["status"] == "done" and delivery["handler"].endswith("console_test_on_push")
    assert [a["outcome"] for a in delivery["history"]] == ["done"]


def test_queue_depths(api, operator, events):
    from tests.console.conftest import grant

    as_user(api, grant(operator, "console.view_ops"))
    depths = api.get("/api/queues/").json()
    assert depths["ingress"]["raw_events_pending"] == 0
    # Held deliveries are waiting too (a paused handler's backlog).
    assert depths["ingress"]["deliveries"] == {
        "pending": 0,
        "processing": 0,
        "dead": 0,
        "held": 0,
    }


# --- actions -------------------------------------------------------------------------------


def test_replay_many_with_per_id_results(api, operator, events, push_handler):
    good, bad = events
    as_user(api, operator)
    response = api.post(REPLAY, {"ids": [good.pk, bad.pk]}, format="json")
    assert response.status_code == 200
    data = response.json()
    assert (data["action"], data["via"], data["actor_username"]) == (
        "raw_event_replay",
        "api",
        "operator",
    )
    assert data["results"] == [
        {"id": good.pk, "outcome": "ok", "detail": "1 deliveries queued", "deliveries_queued": 1},
        {
            "id": bad.pk,
            "outcome": "refused",
            "detail": REPLAY_NOT_VERIFIED.format(id=bad.pk, status="rejected"),
        },
    ]
    inbox_run_once()
    assert push_handler.calls == [good.pk, good.pk]
    audit = api.get("/api/operator-actions/").json()
    assert audit["results"][0]["id"] == data["id"]


def test_reverify_reports_the_new_verdict(api, operator, events):
    _, bad = events
    as_user(api, operator)
    [result] = api.post(REVERIFY, {"ids": [bad.pk]}, format="json").json()["results"]
    assert result["outcome"] == "ok"
    assert (result["signature_status"], result["rejection_reason"]) == (
        "rejected",
        "bad_signature",
    )


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({}, "This field is required."),
        ({"ids": []}, "This list may not be empty."),
        ({"ids": "1,2"}, "Expected a list of items"),
        ({"ids": ["abc"]}, "A valid integer is required."),
        ({"ids": [1.5]}, "A valid integer is required."),
        ({"ids": [None]}, "This field may not be null."),
        ({"ids": [0]}, "greater than or equal to 1"),
        ({"ids": [2**63]}, "less than or equal to"),
        ({"ids": list(range(1, 502))}, "no more than 500"),
        ([1, 2], "Expected a dictionary"),
    ],
)
def test_bad_input_is_a_400_naming_the_problem(api, operator, payload, fragment):
    as_user(api, operator)
    for url in (REPLAY, REVERIFY):
        response = api.post(url, payload, format="json")
        assert response.status_code == 400, response.content
        assert fragment in response.content.decode()
    assert not OperatorAction.objects.exists()


def test_unknown_ids_are_a_400_and_nothing_runs(api, operator, events, push_handler):
    good, _ = events
    as_user(api, operator)
    response = api.post(REPLAY, {"ids": [good.pk, 987654]}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"] == {"ids": ["Unknown raw event ids: 987654."]}
    assert not OperatorAction.objects.exists()
    assert push_handler.calls == [good.pk]


def test_malformed_json_and_wrong_methods(api, operator):
    as_user(api, operator)
    response = api.post(REPLAY, b"{not json", content_type="application/json")
    assert response.status_code == 400
    assert api.get(REPLAY).status_code == 405
    assert api.post(LIST, {}, format="json").status_code == 405


@pytest.mark.parametrize(
    "params",
    [
        {"status": "bogus"},
        {"reason": "nope"},
        {"received_after": "yesterday"},
        {"received_after": "2030-01-01T00:00:00Z", "received_before": "2020-01-01T00:00:00Z"},
        {"stauts": "rejected"},
    ],
)
def test_bad_filters_are_a_400(api, operator, params):
    as_user(api, operator)
    response = api.get(LIST, params)
    assert response.status_code == 400, response.content


def test_unknown_and_absurd_detail_ids_are_404(api, operator):
    as_user(api, operator)
    assert api.get("/api/raw-events/987654/").status_code == 404
    assert api.get("/api/raw-events/99999999999999999999999/").status_code == 404


def test_raw_event_list_pages_without_counting_the_store(api, operator, events):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    as_user(api, operator)
    with CaptureQueriesContext(connection) as queries:
        first = api.get(LIST, {"limit": 1}).json()
    assert not [q for q in queries if "COUNT(" in q["sql"].upper()]
    assert "count" not in first and len(first["results"]) == 1
    assert first["previous"] is None and "cursor=" in first["next"]
    second = api.get(first["next"]).json()
    assert len(second["results"]) == 1 and second["next"] is None
    assert second["results"][0]["id"] != first["results"][0]["id"]


# --- the admin's other actions: mark dead, retry render -------------------------------------


@pytest.fixture
def render_row(client, admin_user):
    from tests.console.samples import side_effect

    return side_effect(client, admin_user)


def test_mark_dead_needs_a_reason_and_records_it(api, operator, render_row):
    as_user(api, operator)
    url = "/api/side-effects/mark-dead/"
    for payload in ({"ids": [render_row.pk]}, {"ids": [render_row.pk], "reason": "   "}):
        response = api.post(url, payload, format="json")
        assert response.status_code == 400, response.content
        assert "reason" in response.json()["errors"]
    assert not OperatorAction.objects.exists()
    response = api.post(url, {"ids": [render_row.pk], "reason": "buyer refunded"}, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert (data["action"], data["via"], data["note"]) == (
        "side_effect_mark_dead",
        "api",
        "buyer refunded",
    )
    assert data["results"][0]["status"] == "dead"
    render_row.refresh_from_db()
    render_row.recap.refresh_from_db()
    assert render_row.status == "dead" and render_row.recap.status == "failed"
    assert "buyer refunded" in render_row.recap.failure_reason


def test_retry_render_through_the_same_service(api, operator, render_row):
    as_user(api, operator)
    url = "/api/recaps/retry-render/"
    api.post(
        "/api/side-effects/mark-dead/",
        {"ids": [render_row.pk], "reason": "stuck"},
        format="json",
    )
    recap_id = str(render_row.recap_id)
    response = api.post(url, {"ids": [recap_id]}, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["action"] == "recap_retry_render"
    assert data["results"] == [
        {
            "id": recap_id,
            "outcome": "ok",
            "detail": "render queued; recap is paid",
            "status": "paid",
        }
    ]
    render_row.refresh_from_db()
    assert render_row.status == "pending"


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"ids": ["not-a-uuid"]}, "Must be a valid UUID."),
        ({"ids": []}, "This list may not be empty."),
        ({"ids": ["00000000-0000-4000-8000-000000000000"]}, "Unknown recap video ids"),
    ],
)
def test_retry_render_bad_ids_are_a_400(api, operator, payload, fragment):
    as_user(api, operator)
    response = api.post("/api/recaps/retry-render/", payload, format="json")
    assert response.status_code == 400, response.content
    assert fragment in response.content.decode()
    assert not OperatorAction.objects.exists()
