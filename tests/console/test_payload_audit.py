"""Every view of a body or headers and every body search is recorded, and only there.

Admin detail page, raw download, API detail and list with payloads, admin and API body
searches: each writes one console.PayloadAccess row (who, when, which rows or which search)
before the payload leaves; staff without the payload permission leave no row because they
see nothing. Auditors read the rows in the admin, read-only. The search term is kept in
that row and in no log line.
"""

import io
import logging

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from console.models import PayloadAccess
from ingress.models import RawEvent
from tests.console.conftest import grant

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/ingress/rawevent/"
AUDIT = "/admin/console/payloadaccess/"


@pytest.fixture
def event():
    return RawEvent.objects.create(
        source="github",
        provider="github",
        method="POST",
        path="/webhooks/github/",
        headers={"x-github-event": "push"},
        body=b'{"ref": "refs/heads/audit-needle"}',
        body_sha256="0" * 64,
    )


def accesses() -> list[tuple]:
    return list(
        PayloadAccess.objects.order_by("id").values_list(
            "actor_username", "kind", "via", "raw_event_ids", "search_term"
        )
    )


# --- the admin -----------------------------------------------------------------------------


def test_admin_detail_page_with_payload_is_recorded(client, payload_operator, event):
    client.force_login(payload_operator)
    response = client.get(reverse("admin:ingress_rawevent_change", args=[event.pk]))
    assert response.status_code == 200 and b"audit-needle" in response.content
    assert accesses() == [("reader", "view", "admin", [event.pk], "")]


def test_admin_detail_page_without_payload_is_not(client, operator, event):
    client.force_login(operator)
    response = client.get(reverse("admin:ingress_rawevent_change", args=[event.pk]))
    assert response.status_code == 200 and b"audit-needle" not in response.content
    assert accesses() == []


def test_admin_page_of_an_unknown_event_records_nothing(client, payload_operator):
    client.force_login(payload_operator)
    response = client.get(reverse("admin:ingress_rawevent_change", args=[987654]))
    assert response.status_code == 302
    assert accesses() == []


def test_raw_download_is_recorded(client, payload_operator, event):
    client.force_login(payload_operator)
    response = client.get(reverse("admin:ingress_rawevent_raw_body", args=[event.pk]))
    assert response.status_code == 200 and response.content == bytes(event.body)
    assert accesses() == [("reader", "download", "admin", [event.pk], "")]


def test_admin_body_search_is_recorded_with_its_term(client, payload_operator, event):
    client.force_login(payload_operator)
    response = client.get(CHANGELIST, {"q": "audit-needle"})
    assert [obj.pk for obj in response.context["cl"].result_list] == [event.pk]
    assert accesses() == [("reader", "search", "admin", [], "audit-needle")]


def test_admin_search_without_payload_permission_searches_no_body_and_records_nothing(
    client, operator, event
):
    client.force_login(operator)
    response = client.get(CHANGELIST, {"q": "audit-needle"})
    assert list(response.context["cl"].result_list) == []
    assert accesses() == []


# --- the API -------------------------------------------------------------------------------


@pytest.fixture
def api():
    return APIClient()


def test_api_detail_with_payload_is_recorded(api, payload_operator, operator, event):
    api.force_authenticate(operator)
    assert "body" not in api.get(f"/api/raw-events/{event.pk}/").json()
    assert accesses() == []
    api.force_authenticate(payload_operator)
    assert "body" in api.get(f"/api/raw-events/{event.pk}/").json()
    assert accesses() == [("reader", "view", "api", [event.pk], "")]


def test_api_list_with_payload_records_the_rows_shown(api, payload_operator, event):
    other = RawEvent.objects.create(
        source="github",
        provider="github",
        method="POST",
        path="/",
        headers={},
        body=b"{}",
        body_sha256="0" * 64,
    )
    api.force_authenticate(payload_operator)
    api.get("/api/raw-events/")
    assert accesses() == []
    api.get("/api/raw-events/", {"include_payload": "true", "limit": 1})
    assert accesses() == [("reader", "list", "api", [other.pk], "")]


@pytest.mark.parametrize("parameter", ["body_contains", "q"])
def test_api_body_search_is_recorded_with_its_term(api, payload_operator, event, parameter):
    api.force_authenticate(payload_operator)
    response = api.get("/api/raw-events/", {parameter: "audit-needle"})
    assert [row["id"] for row in response.json()["results"]] == [event.pk]
    assert accesses() == [("reader", "search", "api", [], "audit-needle")]


def test_api_search_without_payload_permission_records_nothing(api, operator, event):
    api.force_authenticate(operator)
    assert api.get("/api/raw-events/", {"q": "audit-needle"}).json()["results"] == []
    assert api.get("/api/raw-events/", {"body_contains": "x"}).status_code == 403
    assert accesses() == []


# --- the auditors' view --------------------------------------------------------------------


def test_auditors_read_the_trail_and_nobody_edits_it(client, payload_operator, event):
    client.force_login(payload_operator)
    client.get(CHANGELIST, {"q": "audit-needle"})
    # The payload reader is not an auditor.
    assert client.get(AUDIT).status_code == 403

    auditor = grant(payload_operator, "console.view_payloadaccess")
    client.force_login(auditor)
    page = client.get(AUDIT)
    assert page.status_code == 200
    assert b"audit-needle" in page.content and b"searched body text" in page.content
    record = PayloadAccess.objects.get()
    assert client.get(f"{AUDIT}{record.pk}/change/").status_code == 200
    assert client.get(f"{AUDIT}add/").status_code == 403
    assert client.post(f"{AUDIT}{record.pk}/delete/", {"post": "yes"}).status_code == 403
    assert PayloadAccess.objects.count() == 1


# --- search terms never reach the logs -----------------------------------------------------


@pytest.fixture
def log_output():
    """What the project's own log handler writes (its filters included) during the test."""
    [handler] = [h for h in logging.getLogger().handlers if h.get_name() == "console"]
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    previous = handler.setStream(stream)
    yield stream
    handler.setStream(previous)


def test_search_terms_are_not_logged(client, api, operator, payload_operator, event, log_output):
    api.force_authenticate(operator)
    # A refused body search is a 403 that django.request logs with the request's full URL.
    assert api.get("/api/raw-events/", {"body_contains": "needle-in-log"}).status_code == 403
    api.force_authenticate(payload_operator)
    assert api.get("/api/raw-events/", {"q": "needle-in-log"}).status_code == 200
    api.get("/api/raw-events/", {"q": "needle-in-log", "stauts": "x"})  # a 400, logged too
    client.force_login(payload_operator)
    client.get(CHANGELIST, {"q": "needle-in-log", "bogus": "1"})
    output = log_output.getvalue()
    assert "Forbidden: /api/raw-events/" in output and "Bad Request" in output
    assert "needle-in-log" not in output
    assert "body_contains=[redacted]" in output
    assert PayloadAccess.objects.filter(search_term="needle-in-log").exists()
