"""The raw event console: list, filters, search, detail, permissions, replay and re-verify."""

from datetime import timedelta

import pytest
from django.contrib.admin import helpers
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from console.models import OperatorAction
from console.services import BULK_LIMIT
from ingress.inbox import inbox_run_once
from ingress.models import Delivery, RawEvent
from ingress.services import REPLAY_NOT_VERIFIED
from ingress.sources import reset_sources_cache
from tests.console.conftest import receive_github

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/ingress/rawevent/"


def detail_url(event) -> str:
    return reverse("admin:ingress_rawevent_change", args=[event.pk])


def listed_ids(response) -> list[int]:
    return [obj.pk for obj in response.context["cl"].result_list]


def stored(**fields) -> RawEvent:
    defaults = {
        "source": "github",
        "provider": "github",
        "method": "POST",
        "path": "/webhooks/github/",
        "headers": {"content-type": "application/json"},
        "body": b"{}",
        "body_sha256": "0" * 64,
    }
    return RawEvent.objects.create(**{**defaults, **fields})


# --- list, filters, search -----------------------------------------------------------------


def test_list_shows_what_happened_to_each_event(admin_client, client, push_handler):
    good = receive_github(client, delivery="good-1")
    bad = receive_github(client, delivery="bad-1", secret="wrong")
    inbox_run_once()
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    page = response.content.decode()
    assert "good-1" in page and "bad-1" in page
    assert "bad_signature" in page
    assert set(listed_ids(response)) == {good.pk, bad.pk}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("signature_status__exact=rejected", "bad"),
        ("rejection_reason__exact=bad_signature", "bad"),
        ("dispatch_status__exact=dispatched", "good"),
        ("source=github", "both"),
        ("source=stripe", "none"),
        ("provider=github", "both"),
        (
            "received_at__gte=2000-01-01+00:00:00%2B00:00&received_at__lt=2000-01-02+00:00:00%2B00:00",
            "none",
        ),
    ],
)
def test_filters(admin_client, client, push_handler, query, expected):
    good = receive_github(client, delivery="good-1")
    bad = receive_github(client, delivery="bad-1", secret="wrong")
    inbox_run_once()
    ids = set(listed_ids(admin_client.get(f"{CHANGELIST}?{query}")))
    assert (
        ids
        == {
            "good": {good.pk},
            "bad": {bad.pk},
            "both": {good.pk, bad.pk},
            "none": set(),
        }[expected]
    )


def test_search_by_delivery_id_dedup_key_and_id(admin_client, client, push_handler):
    event = receive_github(client, delivery="72d3162e-cc78")
    other = receive_github(client, delivery="other")
    inbox_run_once()
    event.refresh_from_db()
    for term in ("72d3162e-cc78", event.dedup_key, f"#{event.pk}"):
        assert listed_ids(admin_client.get(CHANGELIST, {"q": term})) == [event.pk], term
    assert other.pk not in listed_ids(admin_client.get(CHANGELIST, {"q": "72d3162e"}))


def test_search_by_body_text_works_on_bytes(admin_client):
    match = stored(body='{"customer": "cus_Jötunheim", "note": "x"}'.encode())
    escaped = stored(body=b'{"customer": "cus_J\\u00f6tunheim"}')  # same text, JSON-escaped
    binary = stored(body=bytes(range(256)) + b"cus_J\xc3\xb6tunheim" + b"\xff\xfe")
    stored(body=b"\xff\xfe\x00 not utf-8 and no match")
    stored(body=b'{"customer": "cus_other"}')

    response = admin_client.get(CHANGELIST, {"body": "cus_Jötunheim"})
    assert response.status_code == 200
    assert set(listed_ids(response)) == {match.pk, escaped.pk, binary.pk}
    # Phrases keep their spaces; every term must match.
    assert listed_ids(admin_client.get(CHANGELIST, {"body": '"note": "x"'})) == [match.pk]
    assert listed_ids(admin_client.get(CHANGELIST, {"body": '"cus_other" cus_J'})) == []


def test_the_search_box_never_reads_bodies(admin_client):
    stored(body=b'{"needle": 1}')
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(CHANGELIST, {"q": "needle"})
    assert listed_ids(response) == []
    assert not [q for q in queries if "position(" in q["sql"]]


def test_body_search_reads_one_received_hour_and_says_which(admin_client):
    now = timezone.now()
    recent = stored(body=b'{"needle": 1}')
    stored(body=b'{"needle": 2}', received_at=now - timedelta(hours=3))
    response = admin_client.get(CHANGELIST, {"body": "needle"})
    assert listed_ids(response) == [recent.pk]
    assert "Body text searched in the events received from" in response.content.decode()
    # Another hour, asked for by the received filter.
    start = (now - timedelta(hours=3, minutes=30)).isoformat(sep=" ", timespec="seconds")
    older = admin_client.get(CHANGELIST, {"body": "needle", "received_at__gte": start})
    assert len(listed_ids(older)) == 1 and listed_ids(older) != [recent.pk]


def test_body_search_runs_in_the_database_without_fetching_bodies(admin_client):
    stored(body=b'{"needle": 1}')
    for _ in range(5):
        stored(body=b'{"hay": 1}')
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(CHANGELIST, {"body": "needle"})
    assert len(listed_ids(response)) == 1
    searches = [q["sql"] for q in queries if "position(" in q["sql"]]
    assert searches, "the body condition is part of the SQL"
    for sql in searches:
        selected = sql.split(" FROM ", 1)[0]
        assert '"body"' not in selected and '"headers"' not in selected


def test_body_search_needs_the_payload_permission(client, operator):
    stored(body=b'{"card_last4": "4242"}')
    client.force_login(operator)
    assert listed_ids(client.get(CHANGELIST, {"q": "4242"})) == []
    assert client.get(CHANGELIST, {"body": "4242"}).status_code == 403


# --- detail ---------------------------------------------------------------------------------


def test_detail_shows_verification_deliveries_and_attempts(admin_client, client, push_handler):
    push_handler.fail_with = RuntimeError("downstream hiccup")
    event = receive_github(client, {"ref": "refs/heads/main"}, delivery="d-detail")
    inbox_run_once()
    page = admin_client.get(detail_url(event)).content.decode()
    assert "verified" in page
    assert "#0 (1 configured now)" in page
    assert "console_test_on_push" in page
    assert "attempt 1" in page and "RuntimeError: downstream hiccup" in page
    assert "id:d-detail" in page
    # The configured secret never appears.
    assert "It&#x27;s a Secret to Everybody" not in page
    assert "Secret to Everybody" not in page


def test_detail_pretty_prints_json(admin_client):
    event = stored(body=b'{"a":{"b":[1,2]}}')
    page = admin_client.get(detail_url(event)).content.decode()
    assert "JSON (pretty-printed)" in page
    assert "&quot;a&quot;: {\n    &quot;b&quot;: [\n      1," in page


def test_detail_escapes_html_bodies_and_headers(admin_client):
    event = stored(
        body=b"<script>alert('body')</script>",
        headers={"x-evil": "<img src=x onerror=alert(1)>"},
    )
    page = admin_client.get(detail_url(event)).content.decode()
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&#x27;body&#x27;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_detail_shows_binary_bodies_as_a_hex_dump(admin_client):
    event = stored(body=b"\x00\x01\xffPK\x03\x04 binary")
    response = admin_client.get(detail_url(event))
    page = response.content.decode()
    assert "not UTF-8: hex dump" in page
    assert "00000000  00 01 ff 50 4b 03 04 20" in page


def test_raw_body_download_is_exact_and_never_rendered(admin_client, client, operator):
    body = b"<html><script>x</script>\xff"
    event = stored(body=body)
    url = reverse("admin:ingress_rawevent_raw_body", args=[event.pk])
    response = admin_client.get(url)
    assert response.status_code == 200 and response.content == body
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"].startswith("attachment;")
    assert response["X-Content-Type-Options"] == "nosniff"
    client.force_login(operator)
    assert client.get(url).status_code == 404


def test_staff_without_payload_permission_sees_no_body_or_headers(client, operator):
    event = stored(body=b'{"secret_field": "s3cr3t-value"}', headers={"x-trace": "tr4ce-value"})
    client.force_login(operator)
    response = client.get(detail_url(event))
    assert response.status_code == 200
    page = response.content.decode()
    assert "s3cr3t-value" not in page and "tr4ce-value" not in page
    assert "Body and headers are hidden" in page


def test_staff_with_payload_permission_sees_body_and_headers(client, payload_operator):
    event = stored(body=b'{"field": "v4lue"}', headers={"x-trace": "tr4ce-value"})
    client.force_login(payload_operator)
    page = client.get(detail_url(event)).content.decode()
    assert "v4lue" in page and "tr4ce-value" in page


def test_non_staff_get_nothing(client, outsider):
    event = stored()
    client.force_login(outsider)
    for url in (CHANGELIST, detail_url(event), "/admin/console/operatoraction/"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_raw_events_cannot_be_edited_or_deleted(admin_client):
    event = stored()
    response = admin_client.post(detail_url(event), {"source": "stripe"})
    assert response.status_code == 403
    delete = reverse("admin:ingress_rawevent_delete", args=[event.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert RawEvent.objects.get().source == "github"


def test_unknown_and_absurd_ids_are_not_server_errors(admin_client):
    for pk in ("999999", "99999999999999999999999", "abc"):
        response = admin_client.get(f"{CHANGELIST}{pk}/change/")
        assert response.status_code in (302, 404), pk


# --- actions --------------------------------------------------------------------------------


def post_action(client, action, events, **extra):
    return client.post(
        CHANGELIST,
        {"action": action, helpers.ACTION_CHECKBOX_NAME: [e.pk for e in events], **extra},
    )


def test_replay_asks_for_confirmation_with_the_count(admin_client, client, push_handler):
    events = [receive_github(client, delivery=f"d-{i}") for i in range(3)]
    inbox_run_once()
    response = post_action(admin_client, "replay_selected", events, index="0")
    assert response.status_code == 200
    page = response.content.decode()
    assert "This will touch 3 raw events." in page
    assert "verified / dispatched" in page
    assert 'value="Yes, replay 3"' in page
    # Nothing happened yet.
    assert not OperatorAction.objects.exists()
    assert push_handler.calls == [e.pk for e in events]


def test_replay_runs_records_and_reports(admin_client, admin_user, client, push_handler):
    event = receive_github(client)
    inbox_run_once()
    response = post_action(admin_client, "replay_selected", [event], post="yes")
    assert response.status_code == 302
    record = OperatorAction.objects.get()
    assert (record.action, record.via, record.actor, record.actor_username) == (
        "raw_event_replay",
        "admin",
        admin_user,
        admin_user.username,
    )
    assert (record.requested, record.succeeded, record.outcome) == (1, 1, "succeeded")
    assert record.results == [
        {"id": event.pk, "outcome": "ok", "detail": "1 deliveries queued", "deliveries_queued": 1}
    ]
    messages = [str(m) for m in response.wsgi_request._messages]
    assert messages[0].startswith("Replay: 1 succeeded, 0 refused, 0 failed")
    inbox_run_once()
    assert push_handler.calls == [event.pk, event.pk]


def test_replaying_a_rejected_event_is_refused_clearly(admin_client, client, push_handler):
    rejected = receive_github(client, delivery="bad", secret="wrong")
    good = receive_github(client, delivery="good")
    inbox_run_once()
    pending = stored()
    response = post_action(admin_client, "replay_selected", [rejected, good], post="yes")
    messages = [str(m) for m in response.wsgi_request._messages]
    assert messages[0].startswith("Replay: 1 succeeded, 1 refused, 0 failed")
    refusal = REPLAY_NOT_VERIFIED.format(id=rejected.pk, status="rejected")
    assert f"#{rejected.pk}: {refusal}" in messages
    assert OperatorAction.objects.get().outcome == "partial"
    response = post_action(admin_client, "replay_selected", [pending], post="yes")
    messages = [str(m) for m in response.wsgi_request._messages]
    assert REPLAY_NOT_VERIFIED.format(id=pending.pk, status="pending") in messages[-1]


def test_reverify_after_a_secret_fix(admin_client, client, push_handler, monkeypatch):
    event = receive_github(client, secret="the new secret")
    inbox_run_once()
    monkeypatch.setenv("GITHUB_WEBHOOK_SECRET", "It's a Secret to Everybody,the new secret")
    reset_sources_cache()
    try:
        confirm = post_action(admin_client, "reverify_selected", [event], index="0")
        assert "This will touch 1 raw event." in confirm.content.decode()
        response = post_action(admin_client, "reverify_selected", [event], post="yes")
        inbox_run_once()
    finally:
        monkeypatch.undo()
        reset_sources_cache()
    messages = [str(m) for m in response.wsgi_request._messages]
    assert messages[0].startswith("Re-verify: 1 succeeded")
    assert f"#{event.pk}: verified with secret #1; deliveries created" in messages
    assert push_handler.calls == [event.pk]


def test_detail_page_buttons_come_back_to_the_event(admin_client, client, push_handler):
    event = receive_github(client)
    inbox_run_once()
    page = admin_client.get(detail_url(event)).content.decode()
    assert 'id="console-replay"' in page and 'id="console-reverify"' not in page
    response = post_action(
        admin_client, "replay_selected", [event], post="yes", next=detail_url(event)
    )
    assert response["Location"] == detail_url(event)
    evil = post_action(
        admin_client, "replay_selected", [event], post="yes", next="https://evil.example/"
    )
    assert evil["Location"] == CHANGELIST


def test_actions_need_the_operate_permission(client, django_user_model):
    from tests.console.conftest import grant

    viewer = grant(
        django_user_model.objects.create_user("viewer", is_staff=True),
        "ingress.view_rawevent",
        "ingress.view_raw_payload",
    )
    event = stored()
    client.force_login(viewer)
    response = client.get(CHANGELIST)
    assert response.status_code == 200
    assert "replay_selected" not in response.content.decode()
    post_action(client, "replay_selected", [event], post="yes")
    assert not OperatorAction.objects.exists()
    assert 'id="console-replay"' not in client.get(detail_url(event)).content.decode()


def test_bulk_actions_over_the_limit_are_refused(admin_client, settings, monkeypatch):
    monkeypatch.setattr("console.admin.base.BULK_LIMIT", 2)
    events = [stored() for _ in range(3)]
    response = post_action(admin_client, "replay_selected", events, index="0")
    assert response.status_code == 302
    messages = [str(m) for m in response.wsgi_request._messages]
    assert "at most 2 can be acted on at once" in messages[0]
    assert not OperatorAction.objects.exists()
    assert BULK_LIMIT == 500


def test_delivery_admin_lists_attempts(admin_client, client, push_handler):
    push_handler.fail_with = RuntimeError("flaky")
    event = receive_github(client)
    inbox_run_once()
    delivery = Delivery.objects.get()
    assert listed_ids(admin_client.get("/admin/ingress/delivery/", {"q": str(event.pk)})) == [
        delivery.pk
    ]
    page = admin_client.get(reverse("admin:ingress_delivery_change", args=[delivery.pk]))
    assert "RuntimeError: flaky" in page.content.decode()


def test_a_backfilled_event_says_it_was_verified_by_fetch(admin_client):
    event = RawEvent.objects.create(
        source="stripe",
        provider="stripe",
        method="GET",
        path="/v1/events/evt_backfilled",
        headers={},
        body=b'{"id": "evt_backfilled", "object": "event", "type": "charge.succeeded"}',
        body_sha256="0" * 64,
        origin="backfilled",
        signature_status="verified",
    )
    page = admin_client.get(f"/admin/ingress/rawevent/{event.pk}/change/").content.decode()
    assert "verified by fetch (backfilled)" in page
    assert "secret #None" not in page
    listing = admin_client.get("/admin/ingress/rawevent/?origin__exact=backfilled")
    assert listing.status_code == 200
    assert f"/admin/ingress/rawevent/{event.pk}/change/" in listing.content.decode()
