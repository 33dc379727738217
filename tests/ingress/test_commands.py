"""The inbox's operator commands and the scheduled pass, run as an operator would."""

import json
from datetime import UTC, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from django_q.models import Schedule

from ingress.models import RawEvent
from ingress.tasks import inbox_pass
from kernel.schedules import SCHEDULES
from tests.support.signing import github_headers

pytestmark = pytest.mark.django_db


def receive(client, *, secret=None, delivery="cmd-1"):
    body = json.dumps({"zen": "Keep it logically awesome."}).encode()
    response = client.post(
        "/webhooks/github/",
        body,
        content_type="application/json",
        **github_headers(body, secret=secret, event="ping", delivery=delivery),
    )
    assert response.status_code == 202
    return response.json()["id"]


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_process_inbox_once_reports_what_it_did(client):
    receive(client)
    assert run("process_inbox", "--once") == "verified 1, delivered 0, re-armed 0\n"
    assert RawEvent.objects.get().dispatch_status == "no_handler"


def test_reverify_events_needs_a_selection_and_reports_outcomes(client, monkeypatch):
    with pytest.raises(CommandError):
        run("reverify_events")
    event_id = receive(client, secret="rotated-in secret")
    run("process_inbox", "--once")
    assert run("reverify_events", "--source", "github", "--dry-run") == (
        "would re-verify 1 rejected event(s)\n"
    )
    assert "bad_signature: 1" in run("reverify_events", str(event_id))
    with pytest.raises(CommandError, match="ISO datetime"):
        run("reverify_events", "--since", "yesterday")


def test_list_handlers_prints_the_registry():
    output = run("list_handlers")
    assert output.strip()  # either the registered handlers or an explicit "none"


def test_scheduled_pass_drains_until_idle(client):
    for n in range(3):
        receive(client, delivery=f"sched-{n}")
    totals = inbox_pass()
    assert totals["verified"] == 3
    assert not RawEvent.objects.filter(signature_status="pending").exists()


def test_ensure_schedules_writes_every_declared_schedule_idempotently():
    run("ensure_schedules")
    first_runs = dict(Schedule.objects.values_list("name", "next_run"))
    run("ensure_schedules")
    assert dict(Schedule.objects.values_list("name", "next_run")) == first_runs
    assert set(first_runs) == {entry.name for entry in SCHEDULES}
    assert Schedule.objects.count() == len(SCHEDULES)


def test_nightly_schedules_start_at_their_time_of_day_not_24h_after_deploy():
    run("ensure_schedules")
    now = timezone.now()
    for entry in SCHEDULES:
        if entry.daily_at is None:
            continue
        next_run = Schedule.objects.get(name=entry.name).next_run.astimezone(UTC)
        assert next_run.time() == entry.daily_at
        assert now < next_run <= now + timedelta(days=1)
