"""Incidents (console/incidents/services.py): failures grouped by what they have in common, their
acknowledgement and resolution audited, a resolved group reopened by a new failure, its
dead rows re-armed as one bulk job, and /metrics naming each group for the alert."""

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from console.incidents.services import (
    ACKNOWLEDGED,
    OPEN,
    RESOLVED,
    IncidentGroup,
    incident_acknowledge,
    incident_group_get,
    incident_groups,
    incident_rearm_preview,
    incident_resolve,
)
from console.jobs.services import bulk_job_run, bulk_job_start
from console.models import BulkJob, Incident, OperatorAction
from ingress.inbox import inbox_run_once
from ingress.models import Delivery
from tests.console.conftest import OPERATOR_PERMISSIONS, grant, receive_github

pytestmark = pytest.mark.django_db

HANDLER = "recaps.handlers.record_checkout_session"
KEY = {"kind": "dead_deliveries", "scope": HANDLER, "error_class": "KeyError"}


@pytest.fixture
def oncall(django_user_model):
    user = django_user_model.objects.create_user("oncall", password="pw", is_staff=True)
    return grant(user, *OPERATOR_PERMISSIONS, "console.view_ops")


def dead(count: int, *, error: str, handler: str = HANDLER, at=None, first_event: int = 1):
    at = at or timezone.now()
    return Delivery.objects.bulk_create(
        [
            Delivery(
                raw_event_id=first_event + n,
                handler=handler,
                status="dead",
                attempts=5,
                last_error=error,
                finished_at=at - timedelta(seconds=n),
            )
            for n in range(count)
        ]
    )


def test_two_thousand_dead_deliveries_of_two_causes_are_two_incidents():
    dead(1200, error="KeyError: 'recap_id' missing from the session's metadata")
    dead(800, error="ConnectionError: CRM refused", first_event=5000)
    groups = {g.error_class: g for g in incident_groups(kind="dead_deliveries")}
    assert {name: g.rows for name, g in groups.items()} == {
        "KeyError": 1200,
        "ConnectionError": 800,
    }
    key_error = groups["KeyError"]
    assert key_error.scope == HANDLER and key_error.state == OPEN
    assert key_error.first_seen < key_error.last_seen
    assert Delivery.objects.get(pk=key_error.sample_id).last_error.startswith("KeyError")
    # Text that does not start with a class name is one group, "error", not one per text.
    dead(3, error="it broke", first_event=9000)
    assert ("error", 3) in [
        (g.error_class, g.rows) for g in incident_groups(kind="dead_deliveries")
    ]


def the_group() -> IncidentGroup:
    group = incident_group_get(**KEY)
    assert group is not None
    return group


def test_acknowledge_and_resolve_are_audited_and_a_new_failure_reopens(oncall):
    dead(5, error="KeyError: x", at=timezone.now() - timedelta(minutes=10))
    record = incident_acknowledge(actor=oncall, via="admin", **KEY)
    assert (record.action, record.outcome) == ("incident_acknowledge", "succeeded")
    assert the_group().state == ACKNOWLEDGED
    again = incident_acknowledge(actor=oncall, via="admin", **KEY)
    assert again.outcome == "refused" and "already acknowledged" in again.results[0]["detail"]

    resolved = incident_resolve(actor=oncall, via="api", **KEY)
    assert resolved.outcome == "succeeded" and resolved.target_ids == [Incident.objects.get().pk]
    group = the_group()
    assert group.state == RESOLVED and Incident.objects.get().resolved_by == "oncall"

    # The same cause fails again after the resolution: the group is open again.
    dead(1, error="KeyError: y", at=timezone.now() + timedelta(seconds=5), first_event=100)
    group = the_group()
    assert (group.state, group.reopened, group.rows) == (OPEN, True, 6)
    assert list(OperatorAction.objects.order_by("id").values_list("action", "outcome")) == [
        ("incident_acknowledge", "succeeded"),
        ("incident_acknowledge", "refused"),
        ("incident_resolve", "succeeded"),
    ]


def test_a_group_without_rows_is_refused_and_recorded(oncall):
    record = incident_resolve(actor=oncall, via="api", **KEY)
    assert record.outcome == "refused" and not Incident.objects.exists()


def test_the_database_keeps_one_row_per_group_and_who_did_it():
    from django.db import IntegrityError, transaction

    Incident.objects.create(**KEY)
    with pytest.raises(IntegrityError), transaction.atomic():
        Incident.objects.create(**KEY)
    with pytest.raises(IntegrityError), transaction.atomic():
        Incident.objects.filter(**KEY).update(resolved_at=timezone.now())  # by nobody


def test_a_group_is_rearmed_through_one_bulk_job(oncall, settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "sync": True}
    group_rows = dead(30, error="KeyError: x")
    dead(4, error="ConnectionError: y", first_event=500)
    job = incident_rearm_preview(actor=oncall, via="admin", **KEY)
    assert (job.kind, job.state, job.total) == ("rearm_deliveries", "previewed", 30)
    assert sorted(job.target_ids) == sorted(row.pk for row in group_rows)
    job = bulk_job_run(job_id=bulk_job_start(job=job, actor=oncall, via="admin").id)
    assert (job.state, job.succeeded) == ("done", 30)
    assert Delivery.objects.filter(status="dead").count() == 4
    assert incident_group_get(**KEY) is None


def test_rejected_events_are_grouped_by_source_and_reason_and_not_rearmed(client, oncall):
    from console.incidents.services import IncidentRefused

    for n in range(3):
        receive_github(client, {"n": n}, delivery=f"forged-{n}", secret="wrong")
    inbox_run_once()
    (group,) = incident_groups(kind="rejected_events")
    assert (group.scope, group.error_class, group.rows) == ("github", "bad_signature", 3)
    assert not group.rearmable
    with pytest.raises(IncidentRefused):
        incident_rearm_preview(actor=oncall, via="api", **{**KEY, "kind": "rejected_events"})
    assert not BulkJob.objects.exists()


# --- the pages and the API ---------------------------------------------------------------------


def test_the_incident_pages_ack_resolve_and_rearm(client, oncall):
    dead(12, error="KeyError: x")
    client.force_login(oncall)
    listed = client.get("/ops/incidents/").content.decode()
    url = f"/ops/incidents/dead_deliveries/{HANDLER}/KeyError/"
    assert url in listed and 'data-state="open"' in listed
    page = client.get(url).content.decode()
    assert 'id="incident-acknowledge"' in page and 'id="incident-rearm"' in page
    client.post(f"{url}acknowledge/")
    page = client.get(url).content.decode()
    assert 'data-state="acknowledged"' in page and "by oncall at" in page
    assert 'id="incident-acknowledge"' not in page
    rearm = client.post(f"{url}rearm/")
    job = BulkJob.objects.get()
    assert rearm["Location"] == f"/ops/jobs/{job.pk}/" and job.total == 12
    # The ops page lists it too.
    assert url in client.get("/ops/").content.decode()


def test_viewers_see_incidents_but_cannot_change_them(client, django_user_model):
    dead(2, error="KeyError: x")
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(grant(viewer, "console.view_ops"))
    url = f"/ops/incidents/dead_deliveries/{HANDLER}/KeyError/"
    page = client.get(url).content.decode()
    assert 'id="incident-acknowledge"' not in page and 'id="incident-rearm"' not in page
    assert client.post(f"{url}resolve/").status_code == 403
    assert not OperatorAction.objects.exists()


def test_metrics_name_each_incident_by_its_labels(client, settings):
    dead(3, error="KeyError: x")
    settings.METRICS_BEARER_TOKEN = "incident-metrics-token-0123456789"
    text = client.get(
        "/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.METRICS_BEARER_TOKEN}"
    ).content.decode()
    family = {f.name: f for f in text_string_to_metric_families(text)}["eventdrop_incident_rows"]
    (sample,) = family.samples
    assert sample.labels == {**KEY, "state": "open"} and sample.value == 3


def test_the_alert_links_to_the_incident_page():
    """The alert's link is built from the labels /metrics exports, to the page's URL."""
    from pathlib import Path

    import yaml  # PyYAML comes with drf-spectacular

    rules = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "deploy/prometheus/alerts.yml").read_text()
    )
    (rule,) = [
        r for g in rules["groups"] for r in g["rules"] if r["alert"] == "EventDropIncidentOpen"
    ]
    assert "eventdrop_incident_rows" in rule["expr"]
    link = rule["annotations"]["incident"]
    assert link.endswith(
        "/ops/incidents/{{ $labels.kind }}/{{ $labels.scope }}/{{ $labels.error_class }}/"
    )
