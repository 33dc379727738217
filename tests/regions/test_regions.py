"""The region checks, the processing rule as a table, and the operator's switch of the
processing region as an audited action (console and API). The replication itself runs on
real clusters in test_multi_region.py."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from console.models import OperatorAction, OperatorActionOutcome
from regions.checks import check_peer_agreement, check_region_configuration
from regions.models import ProcessingDecision, RegionState
from regions.selectors import processing_verdict
from tests.console.conftest import OPERATOR_PERMISSIONS, grant

PEER_URL = "postgres://replicator@us-db.internal:5432/eventdrop"


def ids(messages) -> list[str]:
    return [message.id for message in messages]


def test_one_region_needs_nothing(settings):
    settings.EVENTDROP_REGION_PEERS = ""
    settings.EVENTDROP_REGION = ""
    assert check_region_configuration() == []


@pytest.mark.parametrize(
    ("region", "number", "peers", "expected"),
    [
        ("", 1, f"us={PEER_URL}", ["regions.E001"]),  # a region without a name
        ("EU!", 1, f"us={PEER_URL}", ["regions.E002"]),
        ("eu", 0, f"us={PEER_URL}", ["regions.E003"]),
        ("eu", 1, "us", ["regions.E004"]),
        ("eu", 1, f"eu={PEER_URL}", ["regions.E005"]),  # a peer with our own name
        ("eu", 1, f"us={PEER_URL}", []),
    ],
)
def test_the_configuration_is_refused_with_its_reason(settings, region, number, peers, expected):
    settings.EVENTDROP_REGION, settings.EVENTDROP_REGION_NUMBER = region, number
    settings.EVENTDROP_REGION_PEERS = peers
    assert ids(check_region_configuration()) == expected


def test_a_subscription_pointing_at_this_database_is_refused(settings):
    db = settings.DATABASES["default"]
    own = f"postgres://x@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"
    settings.EVENTDROP_REGION, settings.EVENTDROP_REGION_NUMBER = "eu", 1
    settings.EVENTDROP_REGION_PEERS = f"us={own}"
    assert ids(check_region_configuration()) == ["regions.E005"]


@pytest.mark.django_db
def test_secrets_are_compared_by_fingerprint_never_by_value(settings):
    from regions.fingerprints import secret_fingerprints

    settings.EVENTDROP_REGION, settings.EVENTDROP_REGION_NUMBER = "eu", 1
    settings.EVENTDROP_REGION_PEERS = f"us={PEER_URL}"
    ours = secret_fingerprints()
    RegionState.objects.create(name="us", number=2, secret_fingerprints=ours)
    assert check_peer_agreement() == []
    other = {**ours, "stripe": ["0" * 64]}
    RegionState.objects.filter(name="us").update(secret_fingerprints=other, number=1)
    messages = check_peer_agreement()
    assert ids(messages) == ["regions.E007", "regions.E006"]
    assert "'stripe'" in messages[1].msg
    # Neither the row nor the message holds a secret's value.
    stripe_secret = settings.WEBHOOK_SOURCES and __import__("os").environ["STRIPE_WEBHOOK_SECRET"]
    assert stripe_secret not in str(ours) and stripe_secret not in messages[1].msg


NOW = timezone.now()
FRESH = NOW - timedelta(seconds=1)
STALE = NOW - timedelta(hours=1)


def decision(epoch=2, region="us", decided_in="eu", peer_lost=False, at=NOW):
    return ProcessingDecision(
        epoch=epoch,
        processing_region=region,
        decided_in=decided_in,
        peer_lost=peer_lost,
        decided_at=at,
    )


def state(name, seen=0, beat=None, lease_until=None, lease_epoch=0):
    return RegionState(
        name=name,
        number=1,
        seen_epoch=seen,
        heartbeat_at=beat,
        lease_until=lease_until,
        lease_epoch=lease_epoch,
    )


@pytest.mark.parametrize(
    ("me", "other", "made", "may", "why"),
    [
        # Named, and the other region acknowledged the decision freshly: go.
        (state("us"), state("eu", 2, FRESH), decision(), True, "acknowledged"),
        # Named, but the other region has not seen it yet (it may still be working): wait.
        (state("us"), state("eu", 1, FRESH), decision(), False, "not yet acknowledged"),
        # An acknowledgement from long ago is not one (a region back from a crash).
        (state("us"), state("eu", 2, STALE), decision(), False, "not yet acknowledged"),
        # A lease taken under this epoch keeps a region working when the other melts.
        (
            state("us", 2, FRESH, NOW + timedelta(seconds=5), 2),
            state("eu", 1, STALE),
            decision(),
            True,
            "lease",
        ),
        # ... but not a lease of an older epoch.
        (
            state("us", 2, FRESH, NOW + timedelta(seconds=5), 1),
            state("eu", 1, STALE),
            decision(),
            False,
            "not yet acknowledged",
        ),
        # A takeover made here, declaring the other lost, starts at once, for one lease.
        (
            state("us"),
            state("eu", 1, STALE),
            decision(decided_in="us", peer_lost=True),
            True,
            "takeover",
        ),
        (
            state("us"),
            state("eu", 1, STALE),
            decision(decided_in="us", peer_lost=True, at=NOW - timedelta(hours=1)),
            False,
            "not yet acknowledged",
        ),
        # Not named: never.
        (
            state("eu", 2, FRESH, NOW + timedelta(seconds=5), 2),
            state("us", 2, FRESH),
            decision(),
            False,
            "names us",
        ),
    ],
)
def test_the_processing_rule(settings, me, other, made, may, why):
    settings.EVENTDROP_REGION_LEASE_SECONDS = 30
    settings.EVENTDROP_REGION_PEER_FRESH_SECONDS = 30
    verdict = processing_verdict(me=me, others=[other], decision=made, now=NOW)
    assert (verdict.may_process, why in verdict.why) == (may, True), verdict


@pytest.mark.django_db
def test_switching_the_processing_region_is_an_audited_action_in_the_api(
    settings, django_user_model
):
    settings.EVENTDROP_REGION, settings.EVENTDROP_REGION_NUMBER = "eu", 1
    settings.EVENTDROP_REGION_PEERS = f"us={PEER_URL}"
    ProcessingDecision.objects.create(epoch=1, decided_in="eu", processing_region="eu")
    oncall = django_user_model.objects.create_user("oncall", password="pw", is_staff=True)
    api = APIClient()
    api.force_login(grant(oncall, *OPERATOR_PERMISSIONS, "console.view_ops"))

    answer = api.post(
        "/api/regions/processing/", {"region": "us", "reason": "planned"}, format="json"
    )
    assert answer.status_code == 200, answer.content
    made = ProcessingDecision.objects.get(epoch=2)
    assert (made.processing_region, made.decided_in, made.actor_username) == ("us", "eu", "oncall")
    record = OperatorAction.objects.get(action="processing_region")
    assert record.outcome == OperatorActionOutcome.SUCCEEDED and record.note == "planned"
    assert api.get("/api/regions/").json()["processing_region"] == "us"

    # Declaring the other region lost is done from the region taking over, never for it.
    refused = api.post(
        "/api/regions/processing/",
        {"region": "eu", "reason": "us is gone", "peer_lost": True},
        format="json",
    )
    assert refused.status_code == 200  # eu is this region: allowed, us holds no lease here
    refused = api.post("/api/regions/processing/", {"region": "mars", "reason": "?"}, format="json")
    assert refused.status_code == 400
    assert "neither this region" in str(refused.json()["errors"])
    no_reason = api.post("/api/regions/processing/", {"region": "us", "reason": " "}, format="json")
    assert no_reason.status_code == 400


@pytest.mark.django_db
def test_a_takeover_waits_for_the_old_regions_lease(settings):
    from regions.services import RegionError, processing_region_set

    settings.EVENTDROP_REGION, settings.EVENTDROP_REGION_NUMBER = "us", 2
    settings.EVENTDROP_REGION_PEERS = f"eu={PEER_URL}"
    ProcessingDecision.objects.create(epoch=1, decided_in="eu", processing_region="eu")
    RegionState.objects.create(
        name="eu", number=1, lease_until=timezone.now() + timedelta(seconds=20), lease_epoch=1
    )
    with pytest.raises(RegionError, match="holds the processing lease"):
        processing_region_set(region="us", peer_lost=True)
    RegionState.objects.filter(name="eu").update(lease_until=timezone.now() - timedelta(seconds=1))
    assert processing_region_set(region="us", peer_lost=True).epoch == 2


@pytest.mark.django_db
def test_the_lag_per_direction_on_the_ops_page_and_in_metrics(settings, client, django_user_model):
    from console.ops.metrics import region_families
    from regions.selectors import replication_lags

    settings.EVENTDROP_REGION, settings.EVENTDROP_REGION_NUMBER = "eu", 1
    settings.EVENTDROP_REGION_PEERS = f"us={PEER_URL}"
    ProcessingDecision.objects.create(epoch=1, decided_in="eu", processing_region="eu")
    RegionState.objects.create(name="us", number=2, heartbeat_at=timezone.now() - timedelta(90))
    RegionState.objects.create(name="eu", number=1, heartbeat_at=timezone.now())

    families = {family.name: family for family in region_families(replication_lags(timezone.now()))}
    (lag,) = families["eventdrop_region_replication_lag_seconds"].samples
    assert lag.labels == {"source": "us", "target": "eu"} and lag.value >= 90 * 86400
    (up,) = families["eventdrop_region_subscription_up"].samples
    assert up.value == 0  # no subscription in the test database

    oncall = django_user_model.objects.create_user("oncall", password="pw", is_staff=True)
    client.force_login(grant(oncall, "console.view_ops"))
    page = client.get("/ops/").content.decode()
    assert 'id="ops-regions"' in page and "processing: <strong>eu</strong>" in page
    assert 'data-source="us" data-target="eu"' in page and "ops-level-red" in page
    assert "(subscription not running)" in page


@pytest.mark.django_db
def test_one_region_shows_and_exports_no_region(client, django_user_model):
    from console.ops.metrics import region_families
    from regions.selectors import replication_lags

    families = list(region_families(replication_lags(timezone.now())))
    assert all(not family.samples for family in families)
    oncall = django_user_model.objects.create_user("oncall", password="pw", is_staff=True)
    client.force_login(grant(oncall, "console.view_ops"))
    assert 'id="ops-regions"' not in client.get("/ops/").content.decode()
