"""Pauses and bulk jobs on the ops page, in /metrics and on their own pages: figures,
colours by age, the replay SLO, and who may see or change what."""

import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from console.jobs.services import bulk_job_preview
from console.models import BulkJob, OperatorAction
from console.ops.figures import SLOS, Level, ops_snapshot
from console.pauses.services import SOURCE_DISABLE_COST, handlers_pause, pause_level
from ingress.models import HandlerPause
from tests.console.conftest import OPERATOR_PERMISSIONS, grant
from tests.console.test_bulk_jobs import stored_events
from tests.support.tools import tool

pytestmark = pytest.mark.django_db

TOKEN = "pause-console-test-token-0123456789"


@pytest.fixture
def oncall(django_user_model):
    user = django_user_model.objects.create_user("oncall", password="pw-oncall", is_staff=True)
    return grant(user, *OPERATOR_PERMISSIONS, "console.view_ops")


@pytest.fixture
def viewer(django_user_model):
    user = django_user_model.objects.create_user("viewer", password="pw-viewer", is_staff=True)
    return grant(user, "console.view_ops", "console.view_operatoraction")


def paused_for(seconds: float, *, source: str = "github") -> HandlerPause:
    return HandlerPause.objects.create(
        source=source, paused_at=timezone.now() - timedelta(seconds=seconds)
    )


@pytest.mark.parametrize(
    ("age", "level"),
    [(0, "green"), (899, "green"), (900, "yellow"), (3599, "yellow"), (3600, "red")],
)
def test_a_pause_is_coloured_by_its_age(age, level):
    assert pause_level(age) == level


def test_the_thresholds_are_settings(settings):
    settings.HANDLER_PAUSE_YELLOW_SECONDS = 10
    settings.HANDLER_PAUSE_RED_SECONDS = 20
    assert [pause_level(age) for age in (9, 10, 20)] == ["green", "yellow", "red"]


def test_the_ops_page_shows_pauses_held_counts_and_the_source_cost(client, oncall):
    paused_for(4000, source="github")
    paused_for(10, source="stripe")
    snapshot = ops_snapshot()
    assert [row.level for row in snapshot.pauses] == ["red", "green"]
    assert snapshot.worst_level() == Level.RED

    client.force_login(oncall)
    page = client.get("/ops/").content.decode()
    assert 'data-level="red"' in page and "source github" in page
    # The paragraph on disabling a source is on the pauses page only; here, a link to it.
    assert SOURCE_DISABLE_COST.split(":")[0] not in page
    assert "/ops/pauses/#source-disable-cost" in page
    assert "/ops/pauses/" in page and "/ops/jobs/" in page
    assert SOURCE_DISABLE_COST.split(":")[0] in client.get("/ops/pauses/").content.decode()


def test_the_replay_slo_is_a_figure_on_the_ops_page(client, oncall):
    now = timezone.now()
    job = BulkJob.objects.create(
        kind="replay_raw_events",
        via="api",
        actor_username="oncall",
        state="done",
        total=200,
        processed=200,
        succeeded=200,
        started_at=now - timedelta(minutes=5),
        finished_at=now - timedelta(minutes=4),
        slo_measured_at=now - timedelta(minutes=1),
        slo_events=200,
        slo_within=197,
        slo_p99_seconds=130.0,
    )
    figure = {f.slo.key: f for f in ops_snapshot().figures()}["replay_missed"]
    assert figure.value == pytest.approx(0.015)
    assert figure.level == Level.RED  # 1.5 % missed: the SLO asks for 99 % within 2 min
    assert SLOS["replay_missed"].level(0.005) == Level.YELLOW

    client.force_login(oncall)
    page = client.get("/ops/").content.decode()
    assert 'id="slo-replay_missed" data-level="red"' in page
    assert "197 of 200 within 2 min" in page
    # A day later the job no longer counts: no data, not a stale red.
    BulkJob.objects.filter(pk=job.pk).update(slo_measured_at=now - timedelta(hours=25))
    assert {f.slo.key: f for f in ops_snapshot().figures()}["replay_missed"].value is None


def scrape(client, settings) -> str:
    settings.METRICS_BEARER_TOKEN = TOKEN
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    return response.content.decode()


def test_metrics_export_pauses_held_jobs_and_the_replay_slo(client, settings, oncall):
    text = scrape(client, settings)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["eventdrop_handlers_paused"].samples[0].value == 0
    assert not families["eventdrop_replay_slo_missed_ratio"].samples  # no job: absent

    paused_for(120)
    stored_events(2)
    job = bulk_job_preview(actor=oncall, kind="replay_raw_events", via="api", filters={})
    BulkJob.objects.filter(pk=job.pk).update(
        state="running", started_at=timezone.now(), heartbeat_at=timezone.now()
    )
    BulkJob.objects.create(
        kind="replay_raw_events",
        via="api",
        actor_username="oncall",
        state="done",
        started_at=timezone.now(),
        finished_at=timezone.now(),
        slo_measured_at=timezone.now(),
        slo_events=100,
        slo_within=100,
    )
    families = {f.name: f for f in text_string_to_metric_families(scrape(client, settings))}

    def value(name, **labels):
        (match,) = [s.value for s in families[name].samples if s.labels == labels]
        return match

    assert value("eventdrop_handlers_paused") == 1
    assert value("eventdrop_handler_pause_oldest_age_seconds") >= 120
    assert value("eventdrop_deliveries_held") == 0
    assert value("eventdrop_bulk_jobs_active", state="running") == 1
    assert value("eventdrop_bulk_jobs_active", state="queued") == 0
    assert value("eventdrop_replay_slo_events_last_24h") == 100
    assert value("eventdrop_replay_slo_missed_ratio") == 0


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_metrics_with_pauses_and_jobs_pass_promtool(client, settings):
    paused_for(5)
    result = subprocess.run(
        [tool("promtool"), "check", "metrics"],
        input=scrape(client, settings),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    # promtool's lint warns about counters' names; it exits non-zero only on errors.
    assert result.returncode == 0, result.stdout + result.stderr


# --- the pages: who may see and do what ------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "who", "status"),
    [
        ("/ops/pauses/", "viewer", 200),
        ("/ops/pauses/", "oncall", 200),
        ("/ops/jobs/", "viewer", 200),
        ("/ops/jobs/new/", "viewer", 403),
        ("/ops/jobs/new/", "oncall", 200),
    ],
)
def test_page_permissions(client, viewer, oncall, path, who, status):
    client.force_login({"viewer": viewer, "oncall": oncall}[who])
    assert client.get(path).status_code == status


def test_staff_without_view_ops_cannot_see_the_pauses(client, django_user_model):
    user = django_user_model.objects.create_user("staff", password="pw", is_staff=True)
    client.force_login(grant(user, "console.operate"))
    assert client.get("/ops/pauses/").status_code == 403
    assert client.get("/ops/jobs/").status_code == 403


def test_anonymous_is_sent_to_the_login(client):
    response = client.get("/ops/jobs/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_a_viewer_cannot_pause_start_or_cancel(client, viewer, oncall):
    stored_events(1)
    job = bulk_job_preview(actor=oncall, kind="replay_raw_events", via="api", filters={})
    client.force_login(viewer)
    assert client.post("/ops/pauses/pause/", {"source": "github", "reason": "x"}).status_code == 403
    assert client.post(f"/ops/jobs/{job.pk}/start/").status_code == 403
    assert client.post(f"/ops/jobs/{job.pk}/cancel/").status_code == 403
    assert client.get(f"/ops/jobs/{job.pk}/start/").status_code in (403, 405)
    job.refresh_from_db()
    assert job.state == "previewed" and not HandlerPause.objects.exists()
    assert not OperatorAction.objects.exists()


def test_pause_from_the_page_is_recorded_and_a_refusal_is_shown(client, oncall):
    client.force_login(oncall)
    why = {"reason": "the CRM is down"}
    response = client.post("/ops/pauses/pause/", {"source": "github", **why}, follow=True)
    assert "source github: 0 deliveries held" in response.content.decode()
    again = client.post("/ops/pauses/pause/", {"source": "github", **why}, follow=True)
    assert "already paused" in again.content.decode()
    unknown = client.post("/ops/pauses/pause/", {"source": "nowhere", **why}, follow=True)
    assert "No source named" in unknown.content.decode()
    assert list(OperatorAction.objects.order_by("id").values_list("outcome", "via")) == [
        ("succeeded", "admin"),
        ("refused", "admin"),
        ("refused", "admin"),
    ]
    page = client.get("/ops/pauses/").content.decode()
    assert "all handlers paused" in page
    # Who paused it, why, since when, and the held count linking to the held deliveries.
    assert "the CRM is down" in page and ">oncall<" in page
    assert "/admin/ingress/delivery/?status__exact=held&amp;source=github" in page


def test_pausing_asks_for_confirmation_and_a_reason(client, oncall):
    client.force_login(oncall)
    handler = "recaps.handlers.record_checkout_session"
    listed = client.get("/ops/pauses/").content.decode()
    assert f'href="/ops/pauses/pause/?handler={handler}"' in listed
    confirm = client.get("/ops/pauses/pause/", {"handler": handler})
    assert confirm.status_code == 200 and 'name="reason"' in confirm.content.decode()
    assert not OperatorAction.objects.exists()
    # Without a reason: asked again, nothing paused and nothing recorded.
    refused = client.post("/ops/pauses/pause/", {"handler": handler, "reason": "  "})
    assert refused.status_code == 400 and 'id="pause-reason-error"' in refused.content.decode()
    assert not HandlerPause.objects.exists() and not OperatorAction.objects.exists()
    done = client.post("/ops/pauses/pause/", {"handler": handler, "reason": "bug 42"}, follow=True)
    assert f"Paused handler {handler}: 0 deliveries held" in done.content.decode()
    assert OperatorAction.objects.get().note == "bug 42"


def test_pause_is_offered_only_where_handlers_exist(client, oncall):
    client.force_login(oncall)
    page = client.get("/ops/pauses/").content.decode()
    # Test settings: stripe has a handler, github none.
    assert 'data-source="stripe"' in page and 'data-source="github"' not in page
    assert "no handler to pause" in page
    response = client.get("/ops/pauses/pause/", {"source": "github"}, follow=True)
    assert "Source github has no handler" in response.content.decode()


def test_the_job_form_refuses_bad_input_with_the_field(client, oncall):
    stored_events(1)
    client.force_login(oncall)
    response = client.post(
        "/ops/jobs/new/", {"kind": "rearm_side_effects", "handler": "some.handler"}
    )
    assert response.status_code == 400
    assert "handler: handler does not apply" in response.content.decode()
    assert not BulkJob.objects.exists()
    preview = client.post("/ops/jobs/new/", {"kind": "replay_raw_events", "source": "github"})
    assert preview.status_code == 302
    job = BulkJob.objects.get()
    assert preview["Location"] == f"/ops/jobs/{job.pk}/"


def test_handlers_pause_service_records_before_and_after(oncall):
    record = handlers_pause(actor=oncall, via="api", source="github", reason="an incident")
    assert (record.action, record.outcome, record.requested, record.succeeded) == (
        "handler_pause",
        "succeeded",
        1,
        1,
    )
    assert record.target_ids == [HandlerPause.objects.get().pk]
    assert record.note == "an incident"
    assert record.results[0]["detail"] == "Paused source github: 0 deliveries held"


def test_a_pause_needs_a_reason(oncall):
    from console.services import OperatorActionError

    with pytest.raises(OperatorActionError):
        handlers_pause(actor=oncall, via="api", source="github", reason=" ")
    assert not OperatorAction.objects.exists() and not HandlerPause.objects.exists()


def test_the_job_form_validates_filters_with_the_kinds_filterset(client, oncall):
    """A status of another kind of row, a bad date: refused by the kind's FilterSet, as the
    API's list of those rows refuses them."""
    client.force_login(oncall)
    wrong = client.post("/ops/jobs/new/", {"kind": "rearm_deliveries", "status": "verified"})
    assert wrong.status_code == 400
    assert "status: &quot;verified&quot; is not a valid choice" in wrong.content.decode()
    bad = client.post("/ops/jobs/new/", {"kind": "replay_raw_events", "received_after": "soon"})
    assert bad.status_code == 400 and "received_after:" in bad.content.decode()
    nonsense = client.post("/ops/jobs/new/", {"kind": "replay_raw_events", "ids": "1 two"})
    assert nonsense.status_code == 400 and "ids:" in nonsense.content.decode()
    assert not BulkJob.objects.exists()
