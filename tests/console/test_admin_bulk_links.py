"""From the admin's raw event and delivery lists to a bulk job: filters and selection
prefilled in the job form, what cannot be carried named, and the cost of disabling a source."""

from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse
from django.utils.html import escape

from console.models import BulkJob
from console.pauses.services import SOURCE_DISABLE_COST
from tests.console.conftest import OPERATOR_PERMISSIONS, grant
from tests.console.test_bulk_jobs import stored_events

pytestmark = pytest.mark.django_db

RAW_EVENTS = "/admin/ingress/rawevent/"
DELIVERIES = "/admin/ingress/delivery/"


def _link(response) -> dict[str, list[str]]:
    html = response.content.decode()
    start = html.index('id="bulk-job-from-filter"')
    href = html.rindex('href="', 0, start) + len('href="')
    url = html[href : html.index('"', href)].replace("&amp;", "&")
    assert urlsplit(url).path == reverse("console-job-new")
    return parse_qs(urlsplit(url).query)


def test_the_raw_event_list_links_to_the_job_form_with_its_filters(client, operator):
    stored_events(2)
    client.force_login(operator)
    response = client.get(
        RAW_EVENTS,
        {
            "source": "github",
            "event_type": "push",
            "signature_status__exact": "rejected",
            "rejection_reason__exact": "bad_signature",
            "received_at__gte": "2026-12-01 00:00:00+00:00",
            "received_at__lt": "2026-12-02 00:00:00+00:00",
            "o": "1",
        },
    )
    assert response.status_code == 200
    assert _link(response) == {
        "kind": ["replay_raw_events"],
        "source": ["github"],
        "event_type": ["push"],
        "status": ["rejected"],
        "reason": ["bad_signature"],
        "received_after": ["2026-12-01 00:00:00+00:00"],
        "received_before": ["2026-12-02 00:00:00+00:00"],
    }
    assert b"bulk-job-unmapped" not in response.content
    # The form opens with them filled in.
    form = client.get(reverse("console-job-new"), _link(response), follow=True)
    assert b'<option value="github" selected' in form.content
    assert b'value="push"' in form.content
    assert b'value="bad_signature"' in form.content


def test_what_a_job_cannot_filter_by_is_named_beside_the_link(client, operator):
    client.force_login(operator)
    response = client.get(RAW_EVENTS, {"dispatch_status__exact": "dead", "q": "abc"})
    assert _link(response) == {"kind": ["replay_raw_events"]}
    assert b"cannot filter by dispatch_status__exact, search" in response.content


def test_the_delivery_list_links_to_a_rearm_job_with_its_filters(client, operator):
    client.force_login(operator)
    response = client.get(DELIVERIES, {"status__exact": "dead", "handler": "recaps.on_paid"})
    assert _link(response) == {
        "kind": ["rearm_deliveries"],
        "status": ["dead"],
        "handler": ["recaps.on_paid"],
    }


def test_the_selection_opens_the_form_with_its_ids_and_starts_nothing(client, operator):
    events = stored_events(3)
    client.force_login(operator)
    listing = client.get(RAW_EVENTS)
    assert b'id="bulk-job-from-selection"' in listing.content
    chosen = [str(events[0].id), str(events[2].id)]
    response = client.post(
        reverse("console-job-new"),
        {"bulk_job_prefill": "replay_raw_events", "_selected_action": chosen, "action": ""},
    )
    assert response.status_code == 200
    assert f"{chosen[0]} {chosen[1]}</textarea>".encode() in response.content
    assert b'<option value="replay_raw_events" selected' in response.content
    assert not BulkJob.objects.exists()  # prefilled only: not even a preview


@pytest.mark.parametrize(
    "post, message",
    [
        ({}, b"No rows were selected"),
        ({"select_across": "1", "_selected_action": ["1"]}, b"selects by its filter"),
    ],
)
def test_a_selection_that_cannot_be_carried_says_why(client, operator, post, message):
    client.force_login(operator)
    response = client.post(
        reverse("console-job-new"), {"bulk_job_prefill": "replay_raw_events", **post}
    )
    assert response.status_code == 400
    assert message in response.content
    assert not BulkJob.objects.exists()


def test_without_operate_there_is_no_link_and_no_form(client, django_user_model):
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer = grant(viewer, *(p for p in OPERATOR_PERMISSIONS if p != "console.operate"))
    client.force_login(viewer)
    response = client.get(RAW_EVENTS)
    assert response.status_code == 200
    assert b"bulk-job-from-filter" not in response.content
    assert b"bulk-job-from-selection" not in response.content
    prefill = {"bulk_job_prefill": "replay_raw_events", "_selected_action": ["1"]}
    assert client.post(reverse("console-job-new"), prefill).status_code == 403


def test_the_raw_event_list_links_to_what_disabling_a_source_costs(client, operator):
    client.force_login(operator)
    response = client.get(RAW_EVENTS)
    # Said once, on the pauses page; the list links there.
    assert escape(SOURCE_DISABLE_COST).encode() not in response.content
    assert b'href="/ops/pauses/#source-disable-cost"' in response.content
