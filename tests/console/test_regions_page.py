"""The regions page (/ops/regions/): state, acknowledgement, lease and lag per direction; the
planned switch and the takeover as buttons, through the API's service (same guard, same
audit); who may see it and who may switch."""

from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone

from console.models import OperatorAction, OperatorActionOutcome
from regions.models import ProcessingDecision, RegionState
from tests.console.conftest import OPERATOR_PERMISSIONS, grant

pytestmark = pytest.mark.django_db

PAGE = "/ops/regions/"
SWITCH = "/ops/regions/switch/"
PEER_URL = "postgres://replicator@us-db.internal:5432/eventdrop"


@pytest.fixture
def two_regions(settings):
    settings.EVENTDROP_REGION, settings.EVENTDROP_REGION_NUMBER = "eu", 1
    settings.EVENTDROP_REGION_PEERS = f"us={PEER_URL}"
    ProcessingDecision.objects.create(epoch=1, decided_in="eu", processing_region="eu")
    now = timezone.now()
    RegionState.objects.create(name="eu", number=1, seen_epoch=1, heartbeat_at=now)
    RegionState.objects.create(
        name="us", number=2, seen_epoch=0, lease_until=now + timedelta(seconds=20), lease_epoch=1
    )


@pytest.fixture
def oncall(client, django_user_model):
    user = django_user_model.objects.create_user("oncall", password="pw", is_staff=True)
    client.force_login(grant(user, *OPERATOR_PERMISSIONS, "console.view_ops"))
    return user


def test_the_page_shows_who_processes_what_each_region_acknowledged_and_its_lease(
    client, oncall, two_regions
):
    page = client.get(PAGE).content.decode()
    assert "Processing: <strong>eu</strong> from epoch 1" in page
    eu = page[page.index('id="region-eu"') :]
    assert "yes" in eu[: eu.index("</tr>")]
    us = page[page.index('id="region-us"') :]
    assert "not yet" in us[: us.index("</tr>")] and "epoch 1 until" in us[: us.index("</tr>")]
    assert 'id="region-switch-us"' in page and 'id="region-takeover"' not in page


def test_the_planned_switch_is_the_apis_audited_action(client, oncall, two_regions):
    response = client.post(SWITCH, {"region": "us", "reason": "planned maintenance"})
    assert response.status_code == 302
    made = ProcessingDecision.objects.get(epoch=2)
    assert (made.processing_region, made.actor_username) == ("us", "oncall")
    record = OperatorAction.objects.get(action="processing_region")
    assert (record.outcome, record.via, record.note) == (
        OperatorActionOutcome.SUCCEEDED,
        "admin",
        "planned maintenance",
    )
    page = client.get(PAGE).content.decode()
    assert "Processing: <strong>us</strong> from epoch 2" in page
    assert 'id="region-takeover"' in page


def test_a_takeover_is_refused_while_the_holders_lease_runs(client, oncall, settings):
    settings.EVENTDROP_REGION, settings.EVENTDROP_REGION_NUMBER = "us", 2
    settings.EVENTDROP_REGION_PEERS = f"eu={PEER_URL}"
    ProcessingDecision.objects.create(epoch=1, decided_in="eu", processing_region="eu")
    RegionState.objects.create(
        name="eu", number=1, lease_until=timezone.now() + timedelta(seconds=20), lease_epoch=1
    )
    response = client.post(SWITCH, {"region": "us", "reason": "eu is gone", "peer_lost": "1"})
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    assert ProcessingDecision.objects.count() == 1
    assert messages and "lease" in messages[0]
    record = OperatorAction.objects.get(action="processing_region")
    assert record.outcome == OperatorActionOutcome.REFUSED


def test_a_switch_needs_a_reason_and_nothing_is_recorded_without_one(client, oncall, two_regions):
    client.post(SWITCH, {"region": "us", "reason": "  "})
    assert ProcessingDecision.objects.count() == 1 and not OperatorAction.objects.exists()


def test_who_may_see_and_who_may_switch(client, django_user_model, two_regions):
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(viewer)
    assert client.get(PAGE).status_code == 403
    client.force_login(grant(viewer, "console.view_ops"))
    page = client.get(PAGE)
    assert page.status_code == 200 and 'id="region-switch-us"' not in page.content.decode()
    assert client.post(SWITCH, {"region": "us", "reason": "x"}).status_code == 403
    assert ProcessingDecision.objects.count() == 1


def test_with_one_region_there_is_nothing_to_switch(client, oncall):
    assert 'id="regions-one"' in client.get(PAGE).content.decode()
