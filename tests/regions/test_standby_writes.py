"""The standby region refuses every write of processing state (docs/multi-region.md, "Writes
outside processing"); the processing region and one region are unchanged.

The region's role is set as it is in production: the settings name the region and its peer,
and the decision rows (and this region's lease epoch) are written in the test database as
replication and the gate would leave them. The refusals go through the real views (the
console API, the admin's confirmation page, the console's pages, the buyer API), the real
commands and the real django-q2 task functions; nothing else is stubbed. The roles' grants
run on the real PostgreSQL, as the roles (SET ROLE, as tests/console/test_db_roles.py does).
"""

import io
import uuid

import pytest
from django.contrib import messages
from django.contrib.admin import helpers
from django.core.checks import Error, Warning
from django.core.management import CommandError, call_command
from django.db import DatabaseError, ProgrammingError, connection, transaction
from rest_framework.test import APIClient

from console.jobs.services import bulk_job_preview, bulk_job_run, bulk_job_start
from console.models import BulkJob, BulkJobState, OperatorAction
from ingress.models import Delivery, DeliveryAttempt, HandlerPause, RawEvent, ReconciliationRun
from kernel.db_roles import ROLES, db_roles_apply, role_name
from kernel.processing_region import (
    ProcessingNotStarted,
    StandbyRegion,
    require_processing_region,
)
from outbox.models import RecapSideEffect
from recaps.models import Event, Photo, RecapStatus, RecapVideo
from regions import replication
from regions.checks import check_pass_lock_session
from regions.models import ProcessingDecision, RegionState
from regions.services import processing_region_set, region_processing_pass
from tests.console.conftest import OPERATOR_PERMISSIONS, grant
from tests.console.samples import paid_recap
from tests.console.test_bulk_jobs import stored_events
from tests.recaps.factories import EventFactory, RecapFactory

pytestmark = pytest.mark.django_db

PEER_URL = "postgres://replicator@{peer}-db.internal:5432/eventdrop"
PROBLEM = "application/problem+json"


def regions(settings, *, me: str, peer: str, number: int) -> None:
    settings.EVENTDROP_REGION, settings.EVENTDROP_REGION_NUMBER = me, number
    settings.EVENTDROP_REGION_PEERS = f"{peer}={PEER_URL.format(peer=peer)}"


@pytest.fixture
def standby(settings):
    """This region is us; the effective decision (epoch 3, made in eu) names eu."""
    ProcessingDecision.objects.create(epoch=3, decided_in="eu", processing_region="eu")

    def become() -> None:
        regions(settings, me="us", peer="eu", number=2)

    return become


@pytest.fixture
def processing(settings):
    """This region is eu, named by epoch 3, and has started processing under it (its lease
    epoch, written by the gate's first pass under the decision)."""
    ProcessingDecision.objects.create(epoch=3, decided_in="eu", processing_region="eu")
    RegionState.objects.create(name="eu", number=1, lease_epoch=3)

    def become() -> None:
        regions(settings, me="eu", peer="us", number=1)

    return become


@pytest.fixture
def oncall(django_user_model):
    user = django_user_model.objects.create_user("oncall", password="pw", is_staff=True)
    return grant(user, *OPERATOR_PERMISSIONS, "console.view_ops")


@pytest.fixture
def api(oncall):
    client = APIClient()
    client.force_authenticate(oncall)
    return client


def assert_standby_problem(response) -> dict:
    """The one shape of the refusal: 409, RFC 9457, naming both regions and the epoch."""
    assert response.status_code == 409, response.content
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["type"] == "urn:eventdrop:problem:standby_region"
    assert body["title"] == "Conflict" and body["status"] == 409
    assert (body["region"], body["processing_region"], body["epoch"]) == ("us", "eu", 3)
    assert "'eu'" in body["detail"] and "standby" in body["detail"]
    assert "Retry-After" not in response
    return body


def state_counts() -> dict[str, int]:
    """Every table a refused action could have written, and the console's audit trail."""
    return {
        "deliveries": Delivery.objects.count(),
        "attempts": DeliveryAttempt.objects.count(),
        "pauses": HandlerPause.objects.count(),
        "recaps": RecapVideo.objects.count(),
        "side_effects": RecapSideEffect.objects.count(),
        "reconciliation_runs": ReconciliationRun.objects.count(),
        "operator_actions": OperatorAction.objects.count(),
    }


def rows_as_they_are() -> list[tuple]:
    return sorted(
        RawEvent.objects.values_list(
            "id", "signature_status", "dispatch_status", "verify_count", "handled_at"
        )
    )


@pytest.fixture
def stored(client, oncall):
    """Rows of every kind the actions act on, written in one region before the roles are
    set (as replication would have brought them): a verified event with a dead delivery,
    a rejected event, a paid recap with its render row, and a free recap to redeem."""
    [verified] = stored_events(1)
    Delivery.objects.create(raw_event=verified, handler="tests.sample", status="dead")
    [rejected] = stored_events(
        1,
        signature_status="rejected",
        rejection_reason="bad_signature",
        dispatch_status="not_dispatched",
    )
    recap = paid_recap(client, oncall)
    side_effect = RecapSideEffect.objects.get(recap=recap)
    RecapSideEffect.objects.filter(pk=side_effect.pk).update(status="dead", last_error="gone")
    free = RecapFactory.create(is_free=True)
    return {
        "verified": verified,
        "rejected": rejected,
        "recap": recap,
        "side_effect": side_effect,
        "free": free,
    }


# --- the console API: every operator action that writes processing state -----------------------


def operator_requests(rows: dict) -> dict[str, tuple[str, dict]]:
    return {
        "replay": ("/api/raw-events/replay/", {"ids": [rows["verified"].pk]}),
        "reverify": ("/api/raw-events/reverify/", {"ids": [rows["rejected"].pk]}),
        "rearm": ("/api/side-effects/rearm/", {"ids": [rows["side_effect"].pk]}),
        "mark_dead": (
            "/api/side-effects/mark-dead/",
            {"ids": [rows["side_effect"].pk], "reason": "gone"},
        ),
        "retry_render": ("/api/recaps/retry-render/", {"ids": [str(rows["recap"].pk)]}),
        "pause": ("/api/pauses/", {"source": "github", "reason": "flood"}),
        "resume": ("/api/pauses/resume/", {"source": "github"}),
    }


ACTIONS = ["replay", "reverify", "rearm", "mark_dead", "retry_render", "pause", "resume"]


@pytest.mark.parametrize("action", ACTIONS)
def test_each_operator_action_in_the_standby_is_a_409_and_writes_nothing(
    standby, stored, api, action
):
    path, body = operator_requests(stored)[action]
    if action == "resume":
        HandlerPause.objects.create(source="github")
    before, rows = state_counts(), rows_as_they_are()
    standby()
    assert_standby_problem(api.post(path, body, format="json"))
    # Nothing written, not even the audit row: the action was refused as a whole, first.
    assert (state_counts(), rows_as_they_are()) == (before, rows)


def test_reads_stay_allowed_in_the_standby(standby, stored, api):
    standby()
    assert api.get("/api/raw-events/").status_code == 200
    assert api.get(f"/api/raw-events/{stored['verified'].pk}/").status_code == 200
    assert api.get("/api/pauses/").status_code == 200
    assert api.get("/api/regions/").json()["processing_region"] == "eu"


def test_the_way_out_the_switch_itself_is_allowed_in_the_standby(standby, api):
    standby()
    answer = api.post("/api/regions/processing/", {"region": "us", "reason": "move"}, format="json")
    assert answer.status_code == 200, answer.content
    assert ProcessingDecision.objects.get(epoch=4).processing_region == "us"


@pytest.mark.parametrize("action", ["replay", "rearm", "pause"])
def test_the_same_actions_work_in_the_processing_region(processing, stored, api, action):
    path, body = operator_requests(stored)[action]
    processing()
    answer = api.post(path, body, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["outcome"] == "succeeded"


def test_one_region_is_unchanged(stored, api, settings):
    assert settings.EVENTDROP_REGION_PEERS == ""
    # A decision row naming another region means nothing without peers.
    ProcessingDecision.objects.create(epoch=9, decided_in="eu", processing_region="eu")
    path, body = operator_requests(stored)["replay"]
    assert api.post(path, body, format="json").json()["outcome"] == "succeeded"
    require_processing_region()


def test_a_switch_to_this_region_not_yet_started_is_a_503_to_retry(processing, stored, api):
    """Named, but no pass has taken the lease under the decision yet: the previous region
    may still be writing; the answer ends by itself, so a 503 with Retry-After."""
    processing()
    ProcessingDecision.objects.create(epoch=4, decided_in="us", processing_region="eu")
    path, body = operator_requests(stored)["replay"]
    before = state_counts()
    response = api.post(path, body, format="json")
    assert response.status_code == 503 and response["Content-Type"] == PROBLEM
    assert int(response["Retry-After"]) > 0
    problem = response.json()
    assert problem["type"] == "urn:eventdrop:problem:processing_not_started"
    assert (problem["region"], problem["processing_region"], problem["epoch"]) == ("eu", "eu", 4)
    assert state_counts() == before
    RegionState.objects.filter(name="eu").update(lease_epoch=4)  # the gate's next pass
    assert api.post(path, body, format="json").status_code == 200


def test_no_decision_yet_is_a_503_too(settings):
    regions(settings, me="eu", peer="us", number=1)
    with pytest.raises(ProcessingNotStarted, match="region_setup"):
        require_processing_region()


# --- bulk jobs --------------------------------------------------------------------------------


def test_a_bulk_job_is_previewed_but_not_started_in_the_standby(standby, api, oncall):
    stored_events(3)
    standby()
    preview = api.post(
        "/api/jobs/", {"kind": "replay_raw_events", "filters": {"source": "github"}}, format="json"
    )
    assert preview.status_code == 201  # the job row is the region's own
    job_id = preview.json()["id"]
    before = state_counts()
    assert_standby_problem(api.post(f"/api/jobs/{job_id}/start/", {}, format="json"))
    assert BulkJob.objects.get(pk=job_id).state == BulkJobState.PREVIEWED
    assert state_counts() == before


def test_a_running_bulk_job_stops_when_its_region_becomes_the_standby(processing, oncall, settings):
    stored_events(4)
    processing()
    job = bulk_job_preview(actor=oncall, kind="replay_raw_events", via="api", filters={})
    bulk_job_start(job=job, actor=oncall, via="api")  # started in the processing region
    # Before its first batch runs, an operator moves processing to us, and this region (eu)
    # sees the decision replicated: the job's batches ask again, and stop.
    ProcessingDecision.objects.create(epoch=4, decided_in="us", processing_region="us")
    before = state_counts()
    done = bulk_job_run(job_id=job.pk, batch_size=2)
    assert done.state == BulkJobState.FAILED and done.processed == 0
    assert "standby" in done.error and "'us'" in done.error
    assert state_counts() == before


# --- the console's pages: the message, never a 500 ---------------------------------------------


def page_messages(response) -> list[tuple[int, str]]:
    return [(m.level, m.message) for m in messages.get_messages(response.wsgi_request)]


def test_the_admin_action_shows_the_refusal(standby, stored, client, django_user_model):
    admin = django_user_model.objects.create_superuser("lead", password="pw")
    client.force_login(admin)
    standby()
    before = state_counts()
    response = client.post(
        "/admin/ingress/rawevent/",
        {
            "action": "replay_selected",
            helpers.ACTION_CHECKBOX_NAME: [str(stored["verified"].pk)],
            "post": "yes",
        },
    )
    assert response.status_code == 302
    [(level, text)] = page_messages(response)
    assert level == messages.ERROR and "standby" in text and "'eu'" in text
    assert state_counts() == before


def test_the_event_pages_refuse_writes_and_still_show(standby, client, django_user_model):
    """Events and photos are edited on their admin pages (plain ModelAdmins): in the standby
    every POST there (add, change, delete, the list's actions) is the message, nothing
    written; the pages themselves still open."""
    admin = django_user_model.objects.create_superuser("lead", password="pw")
    client.force_login(admin)
    event = EventFactory.create(title="Summer party")
    standby()
    before = (state_counts(), Event.objects.count(), Photo.objects.count())
    assert client.get("/admin/recaps/event/").status_code == 200
    assert client.get(f"/admin/recaps/event/{event.pk}/change/").status_code == 200
    posts = [
        ("/admin/recaps/event/add/", {"title": "New party"}),
        (f"/admin/recaps/event/{event.pk}/change/", {"title": "Renamed"}),
        (f"/admin/recaps/event/{event.pk}/delete/", {"post": "yes"}),
        (
            "/admin/recaps/event/",
            {"action": "free_recap_for_me", helpers.ACTION_CHECKBOX_NAME: [str(event.pk)]},
        ),
        ("/admin/recaps/photo/add/", {"event": event.pk, "storage_key": "k/1.jpg"}),
    ]
    for path, data in posts:
        response = client.post(path, data)
        assert response.status_code == 302 and response["Location"] == path, path
        assert any("standby" in text for _, text in page_messages(response)), path
    assert (state_counts(), Event.objects.count(), Photo.objects.count()) == before
    event.refresh_from_db()
    assert event.title == "Summer party"


def test_the_job_and_pause_pages_show_the_refusal(standby, client, oncall):
    stored_events(2)
    job = bulk_job_preview(actor=oncall, kind="replay_raw_events", via="admin", filters={})
    client.force_login(oncall)
    standby()
    before = state_counts()
    started = client.post(f"/ops/jobs/{job.pk}/start/")
    assert started.status_code == 302
    [(level, text)] = page_messages(started)
    assert level == messages.ERROR and "standby" in text
    paused = client.post("/ops/pauses/pause/", {"source": "github", "reason": "flood"})
    assert paused.status_code == 302 and paused["Location"] == "/ops/pauses/"
    assert any("standby" in text for _, text in page_messages(paused))
    resumed = client.post("/ops/pauses/resume/", {"source": "github"})
    assert resumed.status_code == 302
    assert state_counts() == before
    assert BulkJob.objects.get(pk=job.pk).state == BulkJobState.PREVIEWED


# --- the buyer API ----------------------------------------------------------------------------


def test_buying_checking_out_and_redeeming_are_refused_in_the_standby(standby, stored):
    buyer = APIClient()
    free = stored["free"]
    buyer.force_authenticate(free.buyer)
    event = EventFactory.create()
    unpaid = RecapFactory.create(buyer=free.buyer, is_free=False)
    standby()
    before = state_counts()
    assert_standby_problem(buyer.post("/recaps/", {"event_id": event.id}, format="json"))
    assert_standby_problem(buyer.post(f"/recaps/{unpaid.id}/checkout/", {}, format="json"))
    assert_standby_problem(buyer.post(f"/recaps/{free.id}/redeem/", {}, format="json"))
    assert state_counts() == before
    free.refresh_from_db()
    assert free.status == RecapStatus.PENDING_PAYMENT
    # Reading one's recap stays allowed.
    assert buyer.get(f"/recaps/{free.id}/").status_code == 200


def test_redeeming_works_in_the_processing_region(processing, stored):
    buyer = APIClient()
    buyer.force_authenticate(stored["free"].buyer)
    processing()
    response = buyer.post(f"/recaps/{stored['free'].id}/redeem/", {}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "paid"


# --- commands and the scheduled tasks ------------------------------------------------------------


def test_the_commands_that_write_state_refuse_in_the_standby(standby, stored, settings):
    standby()
    before, rows = state_counts(), rows_as_they_are()
    with pytest.raises(CommandError, match="standby"):
        call_command("reverify_events", str(stored["rejected"].pk), stdout=io.StringIO())
    with pytest.raises(CommandError, match="standby"):
        call_command("reconcile_stripe", stdout=io.StringIO())
    with pytest.raises(CommandError, match="standby"):
        call_command("recover_recaps", stdout=io.StringIO())
    # A dry run is a read.
    out = io.StringIO()
    call_command("reverify_events", str(stored["rejected"].pk), "--dry-run", stdout=out)
    assert "would re-verify 1" in out.getvalue()
    assert (state_counts(), rows_as_they_are()) == (before, rows)


def test_the_scheduled_tasks_skip_in_the_standby(standby, settings):
    from ingress.reconcile.tasks import reconcile_github_nightly, reconcile_stripe_nightly
    from outbox.tasks import recover_recaps

    settings.RECONCILE_GITHUB_HOOKS = ["octo/repo:1"]
    standby()
    before = state_counts()
    assert "standby" in reconcile_stripe_nightly()
    assert "standby" in reconcile_github_nightly()
    assert recover_recaps().startswith("skipped: ")
    assert state_counts() == before


# --- PgBouncer's transaction pooling and the pass lock -----------------------------------------


@pytest.mark.parametrize(
    ("kind", "pooler", "peers", "expected"),
    [
        ("inbox", "pgbouncer", True, [("regions.E008", Error)]),
        ("dispatcher", "pgbouncer", True, [("regions.E008", Error)]),
        ("worker", "pgbouncer", True, [("regions.E008", Error)]),
        ("", "pgbouncer", True, [("regions.W008", Warning)]),
        ("web", "pgbouncer", True, []),  # no pass, no pass lock
        ("inbox", "", True, []),
        ("inbox", "pgbouncer", False, []),  # one region: no pass lock either
    ],
)
def test_transaction_pooling_under_a_pass_is_refused(
    settings, monkeypatch, kind, pooler, peers, expected
):
    if peers:
        regions(settings, me="eu", peer="us", number=1)
    settings.PROCESS_KIND = kind
    # As DATABASE_POOLER=pgbouncer sets it (eventdrop/settings.py); read at connect time
    # only, and the test's connection is open already.
    options = settings.DATABASES["default"].setdefault("OPTIONS", {})
    if pooler:
        monkeypatch.setitem(options, "pooler", pooler)
    else:
        monkeypatch.delitem(options, "pooler", raising=False)
    found = [(message.id, type(message)) for message in check_pass_lock_session()]
    assert found == expected


# --- the roles, on the real PostgreSQL ------------------------------------------------------------

PREFIX = f"edregion_{uuid.uuid4().hex[:6]}_"
PUBLISH = "eventdrop_region_publish_state(boolean)"
TAKEOVER = replication.WITHOUT_STATE_SIGNATURE


def privileged(role: str, signature: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", [role, signature])
        return cursor.fetchone()[0]


def as_role(kind: str, action):
    """Run `action` as the role (SET ROLE, in a savepoint): its result, or the database's
    refusal (the savepoint's rollback undoes the SET ROLE too)."""
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f'SET ROLE "{role_name(kind, PREFIX)}"')
            result = action()
            with connection.cursor() as cursor:
                cursor.execute("RESET ROLE")
            return result
    except DatabaseError as exc:
        return exc


def test_db_roles_grant_the_region_functions_to_exactly_their_callers(settings):
    """Before region_setup made them, nothing to grant (the run still succeeds); after, EXECUTE
    for the gate's callers and the console's takeover, nobody else — PUBLIC included."""
    settings.DATABASE_ROLE_PREFIX = PREFIX
    db_roles_apply()  # no function yet: the grant is skipped
    with connection.cursor() as cursor:
        cursor.execute(replication.publish_state_function("eu"))
        cursor.execute(replication.subscription_without_state_function("eu"))
        cursor.execute("CREATE ROLE edregion_stranger_" + PREFIX[9:-1])
    stranger = "edregion_stranger_" + PREFIX[9:-1]
    # PostgreSQL's default: every role may execute a new function, SECURITY DEFINER or not.
    assert privileged(stranger, PUBLISH)
    db_roles_apply()
    db_roles_apply()  # idempotent
    callers = {"inbox", "dispatcher", "worker"}
    for spec in ROLES:
        role = role_name(spec.kind, PREFIX)
        assert privileged(role, PUBLISH) == (spec.kind in callers), spec.kind
        assert privileged(role, TAKEOVER) == (spec.kind == "console"), spec.kind
    assert not privileged(stranger, PUBLISH) and not privileged(stranger, TAKEOVER)


def test_the_gate_runs_as_the_inbox_and_the_guard_and_takeover_as_the_console(settings):
    settings.DATABASE_ROLE_PREFIX = PREFIX
    with connection.cursor() as cursor:
        cursor.execute(replication.publish_state_function("us"))
        cursor.execute(replication.subscription_without_state_function("us"))
        # A subscription that never connects (created, like region_setup's, by the owner).
        cursor.execute(
            "CREATE SUBSCRIPTION eventdrop_us_from_eu CONNECTION 'host=127.0.0.1 port=1 "
            "dbname=nowhere' PUBLICATION eventdrop_ingest_eu, eventdrop_region_eu, "
            "eventdrop_catalog_eu, eventdrop_state_raw_eu, eventdrop_state_eu "
            "WITH (connect = false)"
        )
    db_roles_apply()
    regions(settings, me="us", peer="eu", number=2)
    RegionState.objects.create(name="us", number=2)
    ProcessingDecision.objects.create(epoch=3, decided_in="eu", processing_region="eu")

    def one_pass() -> bool:
        with region_processing_pass() as here:
            return here

    # The gate as the inbox: beats, reads the decision naming eu, acknowledges it and
    # empties this region's state publications through the function.
    assert as_role("inbox", one_pass) is False
    assert RegionState.objects.get(name="us").seen_epoch == 3
    # The web role may not flip the publications.
    refused = as_role("web", lambda: replication.publish_state(False))
    assert isinstance(refused, ProgrammingError) and "permission denied" in str(refused)

    # The standby guard as the console: it reads what it needs, and refuses.
    def guard() -> str:
        try:
            require_processing_region()
        except StandbyRegion as exc:
            return exc.processing_region
        return "allowed"

    assert as_role("console", guard) == "eu"

    # The takeover as the console: not the subscription's owner, so ALTER SUBSCRIPTION
    # itself is refused; through the function it is done.
    def alter_directly() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "ALTER SUBSCRIPTION eventdrop_us_from_eu SET PUBLICATION eventdrop_ingest_eu "
                "WITH (refresh = false)"
            )

    refused = as_role("console", alter_directly)
    assert isinstance(refused, ProgrammingError) and "must be owner" in str(refused)

    # The whole takeover, as the operator's API runs it: the decision and the re-pointing.
    def take_over() -> int:
        return processing_region_set(region="us", peer_lost=True, reason="eu melted").epoch

    assert as_role("console", take_over) == 4
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT subpublications FROM pg_subscription s JOIN pg_database d "
            "ON d.oid = s.subdbid WHERE d.datname = current_database() "
            "AND s.subname = 'eventdrop_us_from_eu'"
        )
        assert sorted(cursor.fetchone()[0]) == [
            "eventdrop_catalog_eu",
            "eventdrop_ingest_eu",
            "eventdrop_region_eu",
        ]
    # The function touches this region's subscription from a peer, and nothing else.
    def without_state(peer: str) -> bool:
        return replication.subscription_without_state("us", peer, direct_if_no_function=False)

    assert as_role("console", lambda: without_state("mars")) is False
    bad = as_role("console", lambda: without_state("x'; DROP"))
    assert isinstance(bad, Exception) and "not a peer region name" in str(bad)
