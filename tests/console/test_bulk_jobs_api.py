"""The bulk job and pause API: who may call what (real credentials), and what it answers."""

import pytest
from rest_framework.test import APIClient

from console.jobs.services import NOTHING_SELECTED, bulk_job_preview, bulk_job_selection
from console.models import BulkJob, OperatorAction
from ingress.models import Delivery, HandlerPause
from tests.console.conftest import grant
from tests.console.test_api_access import ADMITS, ALL, UNAUTHENTICATED, credentials
from tests.console.test_bulk_jobs import stored_events

pytestmark = pytest.mark.django_db

# name: (method, path, JSON body, permission, status when admitted)
ENDPOINTS = {
    "job_list": ("get", "/api/jobs/", None, "console.view_operatoraction", 200),
    "job_detail": ("get", "/api/jobs/{job}/", None, "console.view_operatoraction", 200),
    "job_preview": (
        "post",
        "/api/jobs/",
        {"kind": "replay_raw_events", "filters": {"source": "github"}},
        "console.operate",
        201,
    ),
    "job_start": ("post", "/api/jobs/{job}/start/", {}, "console.operate", 202),
    "job_cancel": ("post", "/api/jobs/{job}/cancel/", {}, "console.operate", 202),
    "pause_list": ("get", "/api/pauses/", None, "console.view_ops", 200),
    "pause": ("post", "/api/pauses/", {"source": "github", "reason": "x"}, "console.operate", 200),
    "resume": ("post", "/api/pauses/resume/", {"source": "stripe"}, "console.operate", 200),
}
# console/urls.py patterns these cover (test_api_access checks every route is tabled).
ROUTES = {
    "/api/jobs/",
    "/api/jobs/<int:job_id>/",
    "/api/jobs/<int:job_id>/start/",
    "/api/jobs/<int:job_id>/cancel/",
    "/api/pauses/",
    "/api/pauses/resume/",
}


def expected(endpoint: str, identity: str) -> int:
    if identity in UNAUTHENTICATED:
        return 401
    _, _, _, permission, admitted = ENDPOINTS[endpoint]
    return admitted if identity in ADMITS[permission] else 403


@pytest.fixture
def job(django_user_model):
    stored_events(3)
    owner = django_user_model.objects.create_superuser("lead", password="pw-lead")
    HandlerPause.objects.create(source="stripe")  # for the resume
    return bulk_job_preview(actor=owner, kind="replay_raw_events", via="api", filters={})


@pytest.mark.parametrize(
    ("endpoint", "identity", "status"),
    [
        pytest.param(endpoint, identity, expected(endpoint, identity), id=f"{endpoint}-{identity}")
        for endpoint in ENDPOINTS
        for identity in ALL
    ],
)
def test_permission_table(endpoint, identity, status, job, monkeypatch):
    from console.jobs import services as bulk_jobs

    monkeypatch.setattr(bulk_jobs, "_enqueue", lambda job_id: None)  # started, not run
    method, path, body, _, _ = ENDPOINTS[endpoint]
    url = path.format(job=job.pk)
    api = APIClient()
    headers = credentials(identity)
    response = (
        api.get(url, **headers)
        if method == "get"
        else api.post(url, body, format="json", **headers)
    )
    assert response.status_code == status, response.content
    assert response["Content-Type"] == (
        "application/problem+json" if status >= 400 else "application/json"
    )
    job.refresh_from_db()
    if status in (401, 403):
        assert job.state == "previewed"
        assert BulkJob.objects.count() == 1
        assert not OperatorAction.objects.exists()
        assert HandlerPause.objects.filter(resumed_at__isnull=True).count() == 1


@pytest.fixture
def api(operator):
    client = APIClient()
    client.force_login(grant(operator, "console.view_ops"))  # the pauses list needs it
    return client


def test_preview_start_status_cancel_through_the_api(
    api, operator, push_handler, monkeypatch, django_capture_on_commit_callbacks
):
    from console.jobs import services as bulk_jobs

    enqueued: list[int] = []
    monkeypatch.setattr(bulk_jobs, "_enqueue", enqueued.append)
    stored_events(7)
    stored_events(2, source="stripe", event_type="charge.succeeded")

    preview = api.post(
        "/api/jobs/",
        {"kind": "replay_raw_events", "filters": {"source": "github", "event_type": "push"}},
        format="json",
    )
    assert preview.status_code == 201, preview.content
    body = preview.json()
    assert (body["state"], body["total"], body["selected_by"]) == ("previewed", 7, "filters")
    assert body["breakdown"]["by"]["source"] == [["github", 7]]
    assert not Delivery.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        started = api.post(f"/api/jobs/{body['id']}/start/", {}, format="json")
    assert started.status_code == 202 and started.json()["state"] == "queued"
    assert enqueued == [body["id"]]
    again = api.post(f"/api/jobs/{body['id']}/start/", {}, format="json")
    assert again.status_code == 400
    assert "only a previewed job" in again.json()["errors"]["non_field_errors"][0]

    bulk_jobs.bulk_job_run(job_id=body["id"], batch_size=3)
    status = api.get(f"/api/jobs/{body['id']}/").json()
    assert (status["state"], status["processed"], status["batches"]) == ("done", 7, 3)
    assert status["progress_percent"] == 100 and status["operator_action_id"]
    cancel = api.post(f"/api/jobs/{body['id']}/cancel/", {}, format="json")
    assert cancel.status_code == 400

    chosen = [event.pk for event in stored_events(2)]
    by_ids = api.post("/api/jobs/", {"kind": "replay_raw_events", "ids": chosen}, format="json")
    assert by_ids.status_code == 201, by_ids.content
    assert (by_ids.json()["total"], by_ids.json()["selected_by"]) == (2, "ids")


@pytest.mark.parametrize(
    ("payload", "field", "fragment"),
    [
        ({"kind": "nonsense"}, "kind", "not a valid choice"),
        ({"kind": "replay_raw_events", "filters": {"sorce": "github"}}, "filters", "Unknown"),
        ({"kind": "replay_raw_events", "filters": {"reason": "bad"}}, "filters", "rejection"),
        ({"kind": "rearm_side_effects", "filters": {"handler": "x"}}, "handler", "does not apply"),
        ({"kind": "replay_raw_events", "ids": []}, "ids", "empty"),
        ({"kind": "replay_raw_events", "ids": ["x"]}, "ids", "valid integer"),
        ({"kind": "replay_raw_events", "filters": {"source": "nowhere"}}, "non_field_errors", ""),
        (
            {
                "kind": "replay_raw_events",
                "filters": {
                    "received_after": "2026-12-01T12:00:00Z",
                    "received_before": "2026-12-01T11:00:00Z",
                },
            },
            "received_before",
            "later",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, payload, field, fragment):
    stored_events(1)
    response = api.post("/api/jobs/", payload, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert field in errors, errors
    assert fragment.lower() in str(errors[field]).lower()
    if field == "non_field_errors":
        assert errors[field] == [NOTHING_SELECTED]
    assert not BulkJob.objects.exists()


def test_pause_and_resume_are_recorded_operator_actions(api, operator, push_handler):
    handler = "tests.console.conftest.push_handler.<locals>.console_test_on_push"
    paused = api.post("/api/pauses/", {"handler": handler, "reason": "x"}, format="json")
    assert paused.status_code == 200, paused.content
    assert paused.json()["action"] == "handler_pause" and paused.json()["outcome"] == "succeeded"
    listed = api.get("/api/pauses/").json()
    assert [(p["handler"], p["held"], p["level"]) for p in listed] == [(handler, 0, "green")]

    twice = api.post("/api/pauses/", {"handler": handler, "reason": "x"}, format="json")
    assert twice.status_code == 409 and twice.json()["operator_action"]["outcome"] == "refused"
    assert "already paused" in twice.json()["detail"]

    resumed = api.post("/api/pauses/resume/", {"handler": handler}, format="json")
    assert resumed.status_code == 200 and resumed.json()["action"] == "handler_resume"
    assert api.get("/api/pauses/").json() == []
    actions = list(OperatorAction.objects.order_by("id").values_list("action", "outcome"))
    assert actions == [
        ("handler_pause", "succeeded"),
        ("handler_pause", "refused"),
        ("handler_resume", "succeeded"),
    ]
    assert api.post("/api/pauses/", {}, format="json").status_code == 400
    both = api.post(
        "/api/pauses/", {"handler": handler, "source": "github", "reason": "x"}, format="json"
    )
    assert both.status_code == 400


def test_a_time_window_selects_by_received_at(api):
    events = stored_events(10)  # received one second apart, the last one second ago
    after = events[3].received_at
    before = events[7].received_at
    response = api.post(
        "/api/jobs/",
        {
            "kind": "replay_raw_events",
            "filters": {
                "received_after": after.isoformat(),
                "received_before": before.isoformat(),
            },
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["total"] == 4  # [after, before)
    job = BulkJob.objects.get()
    assert job.filters["received_after"] == after.isoformat()
    selected = bulk_job_selection(job=job).order_by("id").values_list("id", flat=True)
    assert list(selected) == [e.id for e in events[3:7]]
