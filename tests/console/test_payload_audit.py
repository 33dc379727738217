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
    response = client.get(CHANGELIST, {"body": "audit-needle"})
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


def test_api_body_search_is_recorded_with_its_term(api, payload_operator, event):
    api.force_authenticate(payload_operator)
    response = api.get("/api/raw-events/", {"body_contains": "audit-needle"})
    assert [row["id"] for row in response.json()["results"]] == [event.pk]
    assert accesses() == [("reader", "search", "api", [], "audit-needle")]


def test_q_searches_ids_and_keys_only_and_records_nothing(api, client, payload_operator, event):
    # Bodies are searched only when asked for explicitly (body_contains, the admin's body form).
    api.force_authenticate(payload_operator)
    assert api.get("/api/raw-events/", {"q": "audit-needle"}).json()["results"] == []
    client.force_login(payload_operator)
    assert list(client.get(CHANGELIST, {"q": "audit-needle"}).context["cl"].result_list) == []
    assert accesses() == []


def test_api_search_without_payload_permission_records_nothing(api, operator, event):
    api.force_authenticate(operator)
    assert api.get("/api/raw-events/", {"q": "audit-needle"}).json()["results"] == []
    assert api.get("/api/raw-events/", {"body_contains": "x"}).status_code == 403
    assert accesses() == []


# --- the auditors' view --------------------------------------------------------------------


def test_auditors_read_the_trail_and_nobody_edits_it(client, payload_operator, event):
    client.force_login(payload_operator)
    client.get(CHANGELIST, {"body": "audit-needle"})
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
    assert api.get("/api/raw-events/", {"body_contains": "needle-in-log"}).status_code == 200
    api.get("/api/raw-events/", {"q": "needle-in-log", "stauts": "x"})  # a 400, logged too
    client.force_login(payload_operator)
    client.get(CHANGELIST, {"q": "needle-in-log", "bogus": "1"})
    output = log_output.getvalue()
    assert "Forbidden: /api/raw-events/" in output and "Bad Request" in output
    assert "needle-in-log" not in output
    assert "body_contains=[redacted]" in output
    assert PayloadAccess.objects.filter(search_term="needle-in-log").exists()


# --- payload clues: a body's hash, a content-hash dedup key, a handler's error text --------
#
# Each confirms a guess about a body (or quotes one): staff without the payload permission
# see none of them, in the admin or the API, and cannot filter or search on them; payload
# readers see them only where the view is recorded.

BODY_HASH = "ab12" * 16
CONTENT_KEY = "sha256:" + "cd34" * 16
ERROR_TEXT = "RecapNotFound: recap 'clue-from-the-body' not found"


@pytest.fixture
def clues(event):
    """A verified event deduplicated on its content hash, and its dead delivery whose
    handler quoted the body in its error."""
    from django.utils import timezone

    from ingress.models import Delivery, DeliveryAttempt

    RawEvent.objects.filter(pk=event.pk).update(
        body_sha256=BODY_HASH,
        dedup_key=CONTENT_KEY,
        signature_status="verified",
        dispatch_status="dispatched",
        verified_at=timezone.now(),
    )
    now = timezone.now()
    delivery = Delivery.objects.create(
        raw_event_id=event.pk, handler="tests.clues", status="dead", last_error=ERROR_TEXT
    )
    DeliveryAttempt.objects.create(
        delivery=delivery,
        number=1,
        started_at=now,
        finished_at=now,
        outcome="dead",
        error=ERROR_TEXT,
    )
    return {"event": event, "delivery": delivery}


def shows_a_clue(text: str) -> bool:
    return any(clue in text for clue in (BODY_HASH, CONTENT_KEY, "clue-from-the-body"))


def admin_pages(clues) -> list[str]:
    event, delivery = clues["event"], clues["delivery"]
    return [
        reverse("admin:ingress_rawevent_change", args=[event.pk]),
        CHANGELIST,
        reverse("admin:ingress_delivery_change", args=[delivery.pk]),
        reverse("admin:ingress_delivery_changelist"),
    ]


def api_reads(clues) -> list[str]:
    event, delivery = clues["event"], clues["delivery"]
    return [
        f"/api/raw-events/{event.pk}/",
        "/api/raw-events/",
        f"/api/deliveries/{delivery.pk}/",
        "/api/deliveries/",
    ]


def test_without_the_payload_permission_no_clue_is_shown(client, api, operator, clues):
    client.force_login(grant(operator, "ingress.view_delivery"))
    for page in admin_pages(clues):
        response = client.get(page)
        assert response.status_code == 200, page
        assert not shows_a_clue(response.content.decode()), page
    api.force_authenticate(operator)
    for url in api_reads(clues):
        response = api.get(url)
        assert response.status_code == 200, url
        assert not shows_a_clue(response.content.decode()), url
    assert "RecapNotFound" in api.get(api_reads(clues)[2]).content.decode()  # its class
    assert accesses() == []


def test_without_the_payload_permission_no_clue_can_be_looked_up(client, api, operator, clues):
    """A filter or a search on a hash answers whether a guessed body was received."""
    client.force_login(operator)
    for params in ({"q": CONTENT_KEY}, {"dedup_key": CONTENT_KEY}, {"body_sha256": BODY_HASH}):
        response = client.get(CHANGELIST, params)
        if response.status_code == 200:  # the search box: nothing found
            assert list(response.context["cl"].result_list) == [], params
        else:  # a filter on a clue: refused
            assert response.status_code == 400, params
    api.force_authenticate(operator)
    assert api.get("/api/raw-events/", {"q": CONTENT_KEY}).json()["results"] == []
    assert api.get("/api/raw-events/", {"dedup_key": CONTENT_KEY}).status_code == 403
    assert api.get("/api/raw-events/", {"body_sha256": BODY_HASH}).status_code == 400
    # A provider's event id is no clue: filtered and shown as before.
    RawEvent.objects.filter(pk=clues["event"].pk).update(dedup_key="id:evt_1")
    [row] = api.get("/api/raw-events/", {"dedup_key": "id:evt_1"}).json()["results"]
    assert row["dedup_key"] == "id:evt_1"
    assert accesses() == []


def test_with_the_payload_permission_each_view_of_a_clue_is_recorded(
    client, api, payload_operator, clues
):
    event, delivery = clues["event"], clues["delivery"]
    reader = grant(payload_operator, "ingress.view_delivery")
    client.force_login(reader)
    page = client.get(reverse("admin:ingress_rawevent_change", args=[event.pk])).content.decode()
    assert BODY_HASH in page and CONTENT_KEY in page and "clue-from-the-body" in page
    page = client.get(reverse("admin:ingress_delivery_change", args=[delivery.pk]))
    assert "clue-from-the-body" in page.content.decode()
    # Lists show no clue, so they record nothing; a filter on one is a recorded search.
    for listing in (CHANGELIST, reverse("admin:ingress_delivery_changelist")):
        assert not shows_a_clue(client.get(listing).content.decode())
    response = client.get(CHANGELIST, {"dedup_key": CONTENT_KEY})
    assert [obj.pk for obj in response.context["cl"].result_list] == [event.pk]

    api.force_authenticate(reader)
    detail = api.get(f"/api/raw-events/{event.pk}/").json()
    assert (detail["body_sha256"], detail["dedup_key"]) == (BODY_HASH, CONTENT_KEY)
    assert detail["deliveries"][0]["last_error"] == ERROR_TEXT
    assert "clue-from-the-body" in api.get(f"/api/deliveries/{delivery.pk}/").content.decode()
    listed = api.get("/api/raw-events/").json()["results"][0]
    assert "body_sha256" not in listed and listed["dedup_key"] is None
    assert not shows_a_clue(api.get("/api/deliveries/").content.decode())
    with_payload = api.get("/api/raw-events/", {"include_payload": "true"}).json()["results"]
    assert with_payload[0]["dedup_key"] == CONTENT_KEY
    api.get("/api/raw-events/", {"dedup_key": CONTENT_KEY})

    assert accesses() == [
        ("reader", "view", "admin", [event.pk], ""),
        ("reader", "view", "admin", [event.pk], ""),
        ("reader", "search", "admin", [], f"dedup_key={CONTENT_KEY}"),
        ("reader", "view", "api", [event.pk], ""),
        ("reader", "view", "api", [event.pk], ""),
        ("reader", "list", "api", [event.pk], ""),
        ("reader", "search", "api", [], CONTENT_KEY),
    ]
