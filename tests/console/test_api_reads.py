"""Read access to everything the console shows (console/*/api.py): the lists' filters,
cursor pages with `count` where cheap, the root, one error shape (RFC 9457) for every answer
that is not a success, 500s included, and /metrics with a console API token."""

from datetime import timedelta

import pytest
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from console.models import OperatorAction
from ingress.inbox import inbox_run_once
from ingress.models import Delivery
from outbox.models import RecapSideEffect
from tests.console.conftest import OPERATOR_PERMISSIONS, grant, receive_github
from tests.console.samples import side_effect, verified_event

pytestmark = pytest.mark.django_db

READER_PERMISSIONS = (
    *OPERATOR_PERMISSIONS,
    "outbox.view_recapsideeffect",
    "recaps.view_recapvideo",
    "console.view_ops",
)


@pytest.fixture
def reader(django_user_model):
    user = django_user_model.objects.create_user("reader", password="pw", is_staff=True)
    return grant(user, *READER_PERMISSIONS)


@pytest.fixture
def api(reader):
    client = APIClient()
    _, token = AuthToken.objects.create(reader)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def deliveries(event_id: int, count: int, **fields) -> list[Delivery]:
    """`count` deliveries of one event, to handlers named for the batch (one each)."""
    batch = Delivery.objects.count()
    return Delivery.objects.bulk_create(
        [
            Delivery(raw_event_id=event_id, handler=f"tests.handler_{batch}_{n}", **fields)
            for n in range(count)
        ]
    )


def test_deliveries_filter_page_by_cursor_and_count_only_where_cheap(api, client, admin_user):
    event = verified_event(client, admin_user)
    deliveries(
        event.pk, 5, status="dead", last_error="KeyError: 'recap'", finished_at=timezone.now()
    )
    deliveries(event.pk, 2, status="done", finished_at=timezone.now())
    first = api.get("/api/deliveries/", {"status": "dead", "limit": 2}).json()
    assert first["count"] == 5 and len(first["results"]) == 2
    assert first["previous"] is None and "cursor=" in first["next"]
    seen = [row["id"] for row in first["results"]]
    page = first
    while page["next"]:
        page = api.get(page["next"]).json()
        seen += [row["id"] for row in page["results"]]
    assert len(seen) == len(set(seen)) == 5
    # Newest first, and a dead row has no next attempt.
    assert seen == sorted(seen, reverse=True)
    assert all(row["next_attempt_at"] is None for row in first["results"])
    # Unfiltered (done rows included): no count, only the cursor.
    assert "count" not in api.get("/api/deliveries/").json()
    assert api.get("/api/deliveries/", {"source": "github", "raw_event": event.pk}).json()[
        "results"
    ]
    assert api.get("/api/deliveries/", {"source": "stripe"}).json()["results"] == []
    detail = api.get(f"/api/deliveries/{seen[0]}/").json()
    assert detail["history"] == [] and detail["raw_event"] == event.pk


def test_handler_errors_are_shown_by_class_without_the_payload_permission(api, client, admin_user):
    event = verified_event(client, admin_user)
    (row,) = deliveries(event.pk, 1, status="dead", last_error="KeyError: 'cs_test_secret'")
    shown = api.get(f"/api/deliveries/{row.pk}/").json()["last_error"]
    assert shown.startswith("KeyError:") and "cs_test_secret" not in shown


def test_side_effects_and_recaps_with_the_admins_filters(api, client, admin_user):
    row = side_effect(client, admin_user)
    other = side_effect(client, admin_user)
    RecapSideEffect.objects.filter(pk=other.pk).update(
        status="dead",
        attempts=5,
        last_error_class="http_500",
        last_error="500",
        finished_at=timezone.now(),
        updated_at=timezone.now() - timedelta(hours=2),
    )
    listed = api.get("/api/side-effects/", {"status": "dead", "attempts": "5+"}).json()
    assert listed["count"] == 1 and listed["results"][0]["id"] == other.pk
    assert (
        api.get("/api/side-effects/", {"last_error_class": "http_500", "state_age": "1h"}).json()[
            "count"
        ]
        == 1
    )
    assert api.get("/api/side-effects/", {"recap": str(row.recap_id)}).json()["count"] == 1
    detail = api.get(f"/api/side-effects/{other.pk}/").json()
    assert detail["status"] == "dead" and detail["next_attempt_at"] is None

    recaps = api.get("/api/recaps/", {"status": "paid"}).json()
    assert recaps["count"] == 2
    assert {r["render_status"] for r in recaps["results"]} == {"pending", "dead"}
    assert api.get("/api/recaps/", {"q": str(other.recap_id)}).json()["count"] == 1
    detail = api.get(f"/api/recaps/{row.recap_id}/").json()
    assert [s["id"] for s in detail["side_effects"]] == [row.pk]


def test_operator_actions_filter_like_the_audit_list(api, client, admin_user, reader):
    from console.services import raw_events_replay

    event = verified_event(client, admin_user)
    raw_events_replay(actor=reader, raw_event_ids=[event.pk], via="api")
    raw_events_replay(actor=admin_user, raw_event_ids=[event.pk], via="admin")
    assert api.get("/api/operator-actions/").json()["count"] == 2
    mine = api.get("/api/operator-actions/", {"actor": "reader", "via": "api"}).json()
    assert [row["actor_username"] for row in mine["results"]] == ["reader"]
    later = (timezone.now() + timedelta(minutes=1)).isoformat()
    assert api.get("/api/operator-actions/", {"started_after": later}).json()["count"] == 0


def test_the_root_lists_every_endpoint_and_what_the_caller_may_use(api):
    endpoints = {e["url"].split("testserver")[1]: e for e in api.get("/api/").json()["endpoints"]}
    for path in (
        "/api/deliveries/",
        "/api/side-effects/",
        "/api/recaps/",
        "/api/incidents/",
        "/api/jobs/",
        "/api/pauses/",
        "/api/operator-actions/",
        "/api/schema/",
    ):
        assert path in endpoints, path
    assert endpoints["/api/deliveries/"]["allowed"] is True
    assert endpoints["/api/raw-events/replay/"]["allowed"] is True  # the reader may operate


def test_the_root_is_held_to_the_urlconf(api):
    """Every route of console/urls.py is listed, with its methods, and nothing else."""
    import re

    from django.urls import get_resolver

    routes = {
        re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", f"/api/{pattern.pattern}")
        for pattern in get_resolver("console.urls").url_patterns
        if getattr(pattern, "name", "") != "not-found"
    }
    from urllib.parse import unquote

    endpoints = api.get("/api/").json()["endpoints"]
    listed = {unquote(e["url"].split("testserver")[1]): e for e in endpoints}
    assert set(listed) == routes
    for path in ("/api/incidents/acknowledge/", "/api/pauses/resume/", "/api/regions/processing/"):
        assert listed[path]["methods"] == ["POST"] and listed[path]["what"], path
    assert listed["/api/pauses/"]["methods"] == ["GET", "POST"]
    assert listed["/api/pauses/"]["write_permission"] == "console.operate"


LISTS = (
    "/api/raw-events/",
    "/api/deliveries/",
    "/api/side-effects/",
    "/api/recaps/",
    "/api/operator-actions/",
    "/api/jobs/",
)


def _cursor(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("url", LISTS)
def test_a_tampered_cursor_is_a_404_problem_and_a_bad_limit_a_400(api, client, admin_user, url):
    verified_event(client, admin_user)
    for cursor in (
        _cursor("o=0&r=0&p=not-a-position"),  # decodes, but no value of the ordering's field
        _cursor("o=1&p=2026-13-45"),
        "%%%not-base64",
        _cursor("junk that decodes"),  # was answered as the first page
        _cursor("o=abc"),
    ):
        assert_problem(api.get(url, {"cursor": cursor}), 404)
    for limit in ("abc", "0", "-1", "1.5", ""):
        body = assert_problem(api.get(url, {"limit": limit}), 400)
        assert "limit" in body["errors"]
    assert api.get(url, {"limit": "100000"}).status_code == 200  # capped, as documented


def test_following_next_while_webhooks_arrive_repeats_and_skips_nothing(api, client, admin_user):
    for n in range(7):
        receive_github(client, {"n": n}, delivery=f"before-{n}")
    from ingress.models import RawEvent

    existing = set(RawEvent.objects.values_list("id", flat=True))
    seen: list[int] = []
    page = api.get("/api/raw-events/", {"limit": 2}).json()
    arrived = 0
    while True:
        seen += [row["id"] for row in page["results"]]
        receive_github(client, {"during": arrived}, delivery=f"during-{arrived}")
        arrived += 1
        if not page["next"]:
            break
        page = api.get(page["next"]).json()
    assert len(seen) == len(set(seen)), "a row repeated"
    assert set(seen) == existing, "a row skipped (or one that arrived meanwhile listed)"


def test_a_rejected_events_rejection_time_is_not_its_verified_at(api, client):
    event = receive_github(client, {"zen": "x"}, delivery="forged", secret="wrong-secret")
    inbox_run_once()
    answer = APIClient()
    answer.credentials(**api._credentials)
    body = answer.get(f"/api/raw-events/{event.pk}/").json()
    assert body["signature_status"] == "rejected"
    assert body["verified_at"] is None and body["rejected_at"] is not None
    listed = answer.get("/api/raw-events/").json()["results"][0]
    assert (listed["verified_at"], listed["rejected_at"]) == (None, body["rejected_at"])


# --- one error shape ----------------------------------------------------------------------------


def assert_problem(response, status: int) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["type"].startswith("urn:eventdrop:problem:")
    assert body["title"] and body["detail"]
    return body


def test_every_error_is_a_problem(api):
    assert assert_problem(api.get("/api/deliveries/", {"status": "nope"}), 400)["errors"] == {
        "status": ['"nope" is not a valid choice.']
    }
    assert assert_problem(api.get("/api/deliveries/", {"stauts": "dead"}), 400)["errors"] == {
        "stauts": ["Unknown filter."]
    }
    assert_problem(api.get("/api/deliveries/987654/"), 404)
    assert_problem(api.get("/api/no-such-endpoint/"), 404)
    assert_problem(api.delete("/api/deliveries/"), 405)
    assert_problem(APIClient().get("/api/deliveries/"), 401)
    assert_problem(api.post("/api/raw-events/replay/", "ids=1", content_type="text/plain"), 415)


def test_a_500_is_a_problem_without_the_exceptions_text(api, monkeypatch):
    def explode(**kwargs):
        raise RuntimeError("secret payload text")

    monkeypatch.setattr("console.ops.api.queue_depths", explode)
    body = assert_problem(api.get("/api/queues/"), 500)
    assert "secret payload text" not in str(body) and body["type"].endswith("server_error")


def test_the_database_down_is_a_503_problem_to_retry(api, monkeypatch):
    from django.db import OperationalError

    def down(**kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr("console.ops.api.queue_depths", down)
    response = api.get("/api/queues/")
    assert_problem(response, 503)
    assert response["Retry-After"]


def test_a_refused_pause_is_a_409_problem_naming_its_operator_action(client, django_user_model):
    user = django_user_model.objects.create_user("op", password="pw", is_staff=True)
    grant(user, *OPERATOR_PERMISSIONS)
    api = APIClient()
    _, token = AuthToken.objects.create(user)
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    body = assert_problem(api.post("/api/pauses/resume/", {"source": "github"}, format="json"), 409)
    assert "not paused" in body["detail"]
    assert body["operator_action"]["outcome"] == "refused"
    assert OperatorAction.objects.get().pk == body["operator_action"]["id"]


# --- /metrics with a console token, and how long until we catch up ----------------------------


def test_metrics_accept_a_console_token_with_view_ops(client, reader, django_user_model):
    _, token = AuthToken.objects.create(reader)
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 200 and b"eventdrop_queue_backlog" in response.content
    staff = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    _, without = AuthToken.objects.create(staff)
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Token {without}").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token " + "0" * 64).status_code == 401


def test_queues_say_how_long_until_we_catch_up(api, client, admin_user):
    event = verified_event(client, admin_user)
    now = timezone.now()
    deliveries(event.pk, 30, status="done", finished_at=now - timedelta(minutes=1))
    deliveries(event.pk, 4, status="done", finished_at=now - timedelta(minutes=20))
    deliveries(event.pk, 60)
    drain = api.get("/api/queues/").json()["drain"]["deliveries"]
    # 30 finished in the 5-minute window: 0.1 a second; 60 waiting: 10 minutes to clear.
    assert drain["backlog"] >= 60 and drain["drained"] == 30
    assert drain["per_second"] == pytest.approx(0.1)
    assert drain["seconds_to_clear"] == pytest.approx(drain["backlog"] / 0.1)
    assert api.get("/api/queues/").json()["drain"]["side_effects"]["seconds_to_clear"] == 0.0
