"""Trying to break bulk jobs and pauses: hostile input, double clicks, races, stale previews.

Real PostgreSQL connections for the races (threads, each with its own connection); the
worker killed mid-batch is in test_bulk_jobs_kill.py.
"""

import contextlib
import json
import threading

import pytest
from django.db import connections
from rest_framework.test import APIClient

from console.jobs import services as bulk_jobs
from console.jobs.services import (
    MAX_SELECTED_IDS,
    NOTHING_SELECTED,
    bulk_job_cancel,
    bulk_job_preview,
    bulk_job_run,
    bulk_job_start,
)
from console.models import BulkJob, BulkJobItem, OperatorAction
from ingress.models import HandlerPause
from tests.console.conftest import OPERATOR_PERMISSIONS, grant
from tests.console.test_bulk_jobs import stored_events

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(operator):
    client = APIClient()
    client.force_login(grant(operator, "console.view_ops"))
    return client


@pytest.fixture
def no_enqueue(monkeypatch):
    """The test runs the job itself (the test settings' django-q2 would run it inline)."""
    monkeypatch.setattr(bulk_jobs, "_enqueue", lambda job_id: None)


def _post_raw(api, path: str, body: str | bytes, content_type="application/json"):
    return api.generic("POST", path, body, content_type=content_type)


# --- hostile input through the API: a precise 4xx JSON answer, never a 500 --------------------


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        pytest.param("{not json", 400, "JSON parse error", id="not-json"),
        pytest.param("", 400, "kind", id="empty-body"),
        pytest.param("null", 400, "", id="null"),
        pytest.param('"replay_raw_events"', 400, "dictionary", id="a-string"),
        pytest.param("[1, 2]", 400, "dictionary", id="a-list"),
        pytest.param('{"kind": ["replay_raw_events"]}', 400, "kind", id="kind-a-list"),
        pytest.param('{"kind": "replay_raw_events", "filters": []}', 400, "dictionary", id="fl"),
        pytest.param('{"kind": "replay_raw_events", "filters": "x"}', 400, "dictionary", id="fs"),
        pytest.param('{"kind": "replay_raw_events", "ids": "1,2"}', 400, "list", id="ids-str"),
        pytest.param('{"kind": "replay_raw_events", "ids": [1.5]}', 400, "integer", id="float"),
        pytest.param('{"kind": "replay_raw_events", "ids": [true]}', 400, "integer", id="bool"),
        pytest.param('{"kind": "replay_raw_events", "ids": [-1]}', 400, "greater", id="neg"),
        pytest.param('{"kind": "replay_raw_events", "ids": [1e30]}', 400, "", id="huge-id"),
        pytest.param(
            '{"kind": "replay_raw_events", "ids": [99999999999999999999999]}', 400, "", id="bigint"
        ),
        pytest.param('{"kind": "replay_raw_events", "ids": [NaN]}', 400, "", id="nan"),
        pytest.param(
            '{"kind": "replay_raw_events", "filters": {"event_type": "a\\u0000b"}}',
            400,
            "null",
            id="nul-char",
        ),
        pytest.param(
            '{"kind": "replay_raw_events", "filters": {"received_after": 12}}',
            400,
            "received_after",
            id="window-int",
        ),
        pytest.param(
            '{"kind": "replay_raw_events", "filters": '
            '{"received_after": "9999-12-31T23:59:59-05:00"}}',
            400,
            "received_after",
            id="window-overflow",
        ),
        pytest.param(
            '{"kind": "replay_raw_events", "filters": {"source": {"$ne": 1}}}',
            400,
            "source",
            id="source-an-object",
        ),
        pytest.param(
            '{"kind": "replay_raw_events", "filters": {"source": "github"}, "ids": [1]}',
            400,
            "not both",
            id="ids-and-filters",
        ),
        pytest.param("[" * 100_000 + "]" * 100_000, 400, "", id="deeply-nested"),
        pytest.param(
            '{"kind": "replay_raw_events", "filters": ' + '{"a": ' * 5000 + "1" + "}" * 5001,
            400,
            "",
            id="deep-dict",
        ),
    ],
)
def test_hostile_preview_bodies_are_a_4xx_json_answer(api, body, status, fragment):
    stored_events(1)
    response = _post_raw(api, "/api/jobs/", body)
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"] == "application/problem+json"
    assert fragment.lower() in json.dumps(response.json()).lower()
    assert not BulkJob.objects.exists()


def test_a_form_body_is_a_415(api):
    response = _post_raw(
        api, "/api/jobs/", "kind=replay_raw_events", "application/x-www-form-urlencoded"
    )
    assert response.status_code == 415


def test_more_ids_than_the_limit_is_a_400_naming_ids(api):
    body = {"kind": "replay_raw_events", "ids": list(range(1, MAX_SELECTED_IDS + 2))}
    response = api.post("/api/jobs/", body, format="json")
    assert response.status_code == 400
    assert "ids" in response.json()["errors"]


def test_a_huge_id_list_is_refused_for_its_length_before_its_items(api):
    # One bad item among too many: the answer is "too many", not a report of the items.
    ids: list = list(range(1, MAX_SELECTED_IDS * 3))
    ids[5] = "x"
    response = api.post("/api/jobs/", {"kind": "replay_raw_events", "ids": ids}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"] == {
        "ids": [f"Ensure this field has no more than {MAX_SELECTED_IDS} elements."]
    }


def test_unknown_ids_are_named(api):
    events = stored_events(2)
    body = {"kind": "replay_raw_events", "ids": [events[0].id, 10**9]}
    response = api.post("/api/jobs/", body, format="json")
    assert response.status_code == 400
    assert response.json()["errors"] == {"ids": [f"Unknown ids: {10**9}."]}


@pytest.mark.parametrize("kind", ["replay_raw_events", "rearm_deliveries"])
def test_an_unknown_handler_is_named_not_an_empty_selection(api, kind):
    stored_events(2)
    body = {"kind": kind, "filters": {"handler": "recaps.handlers.no_such_handler"}}
    response = api.post("/api/jobs/", body, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert list(errors) == ["handler"], errors
    assert "no_such_handler" in errors["handler"][0]
    assert "registered" in errors["handler"][0]


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        ("replay_raw_events", "dead"),
        ("rearm_deliveries", "verified"),
        ("rearm_side_effects", "held"),
        ("rearm_side_effects", "rejected"),
    ],
)
def test_a_status_of_another_kind_of_row_is_named(api, kind, status):
    stored_events(2)
    response = api.post("/api/jobs/", {"kind": kind, "filters": {"status": status}}, format="json")
    assert response.status_code == 400
    assert "Not a status of" in response.json()["errors"]["filters"]["status"][0]
    assert not BulkJob.objects.exists()


def test_a_filter_matching_nothing_is_refused_and_creates_no_job(api):
    stored_events(2, source="github")
    response = api.post(
        "/api/jobs/",
        {"kind": "replay_raw_events", "filters": {"event_type": "nope"}},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["errors"] == {"non_field_errors": [NOTHING_SELECTED]}
    assert not BulkJob.objects.exists()


@pytest.mark.parametrize(
    "path", ["/api/jobs/999999/start/", "/api/jobs/99999999999999999999/cancel/"]
)
def test_start_or_cancel_of_no_such_job_is_a_404_json(api, path):
    response = api.post(path, {}, format="json")
    assert response.status_code == 404
    assert "detail" in response.json()


@pytest.mark.parametrize(
    "body",
    [
        '{"handler": ["x"]}',
        '{"handler": "", "source": ""}',
        '{"handler": "a", "source": "b"}',
        "[]",
        "{bad",
    ],
)
def test_hostile_pause_bodies_are_a_400(api, body):
    response = _post_raw(api, "/api/pauses/", body)
    assert response.status_code == 400, response.content
    assert not HandlerPause.objects.exists()


def test_pausing_an_unknown_handler_is_a_recorded_refusal(api):
    body = {"handler": "no.such.handler", "reason": "x"}
    response = api.post("/api/pauses/", body, format="json")
    assert response.status_code == 409
    assert response.json()["operator_action"]["outcome"] == "refused"
    assert not HandlerPause.objects.exists()


# --- double submit, races, stale previews --------------------------------------------------------


def _in_threads(calls: list) -> list:
    """Run the calls from threads at once (each its own connection); their results."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(n):
        try:
            barrier.wait(10)
            results[n] = calls[n]()
        except Exception as exc:  # the refusal of the loser, to assert on
            results[n] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.mark.django_db(transaction=True)
def test_start_clicked_twice_at_once_starts_one_job(operator, no_enqueue):
    stored_events(5)
    job = bulk_job_preview(actor=operator, kind="replay_raw_events", via="admin", filters={})
    results = _in_threads([lambda: bulk_job_start(job=job, actor=operator, via="admin")] * 2)
    started = [r for r in results if isinstance(r, BulkJob)]
    refused = [r for r in results if isinstance(r, bulk_jobs.BulkJobError)]
    assert (len(started), len(refused)) == (1, 1), results
    assert OperatorAction.objects.filter(bulk_job=job).count() == 1


def test_start_posted_twice_from_the_page_starts_one_job(client, operator, no_enqueue):
    stored_events(3)
    job = bulk_job_preview(actor=operator, kind="replay_raw_events", via="admin", filters={})
    client.force_login(operator)
    first = client.post(f"/ops/jobs/{job.id}/start/", follow=True)
    second = client.post(f"/ops/jobs/{job.id}/start/", follow=True)
    assert first.status_code == second.status_code == 200
    assert b"only a previewed job can be started" in second.content
    assert OperatorAction.objects.filter(bulk_job=job).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_jobs_on_overlapping_selections_at_once_both_finish_once_each(operator, no_enqueue):
    events = stored_events(1_200)
    ids = [e.id for e in events]
    first = bulk_job_start(
        job=bulk_job_preview(
            actor=operator, kind="replay_raw_events", via="api", target_ids=ids[:900]
        ),
        actor=operator,
        via="api",
    )
    second = bulk_job_start(
        job=bulk_job_preview(
            actor=operator, kind="replay_raw_events", via="api", target_ids=ids[300:]
        ),
        actor=operator,
        via="api",
    )
    results = _in_threads(
        [
            lambda: bulk_job_run(job_id=first.id, batch_size=100),
            lambda: bulk_job_run(job_id=second.id, batch_size=100),
        ]
    )
    assert all(isinstance(r, BulkJob) for r in results), results
    for job, count in ((first, 900), (second, 900)):
        job.refresh_from_db()
        assert (job.state, job.processed, job.succeeded, job.failed) == ("done", count, count, 0)
        assert OperatorAction.objects.get(bulk_job=job).outcome == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_the_last_batch_accounts_for_every_row(operator, no_enqueue, monkeypatch):
    stored_events(300)
    job = bulk_job_start(
        job=bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={}),
        actor=operator,
        via="api",
    )
    # The cancel arrives while the last batch holds the job row.
    real = bulk_jobs.raw_events_replay_batch
    cancel_results: list[str] = []
    waiting: list[bool] = []
    threads: list[threading.Thread] = []

    def cancel_from_elsewhere() -> None:
        try:
            cancel_results.append(_cancel_quietly(job, operator))
        finally:
            connections.close_all()

    def replay(*, raw_event_ids, force=False):
        if raw_event_ids[-1] == job.upper_id:
            threads.append(threading.Thread(target=cancel_from_elsewhere))
            threads[0].start()
            threads[0].join(0.5)
            waiting.append(threads[0].is_alive())  # it waits on the job row
        return real(raw_event_ids=raw_event_ids, force=force)

    monkeypatch.setattr(bulk_jobs, "raw_events_replay_batch", replay)
    bulk_job_run(job_id=job.id, batch_size=100)
    threads[0].join(30)
    assert waiting == [True] and cancel_results, (waiting, cancel_results)
    bulk_job_run(job_id=job.id, batch_size=100)  # the sweep's re-run after the cancel landed
    job.refresh_from_db()
    action = OperatorAction.objects.get(bulk_job=job)
    assert job.processed == 300 and job.state in ("done", "cancelled")
    assert action.requested == action.succeeded + action.refused + action.failed + action.skipped
    assert action.skipped == 0 and action.finished_at is not None
    assert BulkJobItem.objects.filter(job=job).count() == 300


def _cancel_quietly(job, actor):
    try:
        return bulk_job_cancel(job=job, actor=actor).state
    except bulk_jobs.BulkJobError as exc:
        return str(exc)


def test_rows_added_after_the_preview_are_left_alone(operator, no_enqueue):
    old = stored_events(150)
    job = bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={})
    late = stored_events(50)
    job = bulk_job_run(job_id=bulk_job_start(job=job, actor=operator, via="api").id, batch_size=40)
    assert (job.state, job.total, job.processed) == ("done", 150, 150)
    acted = set(BulkJobItem.objects.filter(job=job).values_list("target_id", flat=True))
    assert acted == {e.id for e in old}
    assert not acted & {e.id for e in late}


def test_a_job_that_selects_nothing_any_more_finishes_with_nothing_done(operator, no_enqueue):
    events = stored_events(5)
    job = bulk_job_preview(
        actor=operator, kind="replay_raw_events", via="api", filters={"event_type": "push"}
    )
    from ingress.models import RawEvent

    RawEvent.objects.filter(id__in=[e.id for e in events]).update(event_type="other")
    job = bulk_job_run(job_id=bulk_job_start(job=job, actor=operator, via="api").id)
    action = OperatorAction.objects.get(bulk_job=job)
    assert (job.state, job.processed) == ("done", 0)
    assert (action.requested, action.skipped, action.outcome) == (5, 5, "succeeded")


# --- permissions: without console.operate nothing can be started, cancelled or paused ------------


@pytest.fixture
def viewer(django_user_model):
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    return grant(
        user, *(p for p in OPERATOR_PERMISSIONS if p != "console.operate"), "console.view_ops"
    )


def test_without_operate_the_api_refuses_every_write(viewer, operator, no_enqueue):
    stored_events(2)
    job = bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={})
    client = APIClient()
    client.force_login(viewer)
    for path, body in (
        ("/api/jobs/", {"kind": "replay_raw_events"}),
        (f"/api/jobs/{job.id}/start/", {}),
        (f"/api/jobs/{job.id}/cancel/", {}),
        ("/api/pauses/", {"source": "github", "reason": "x"}),
        ("/api/pauses/resume/", {"source": "github"}),
    ):
        assert client.post(path, body, format="json").status_code == 403, path
    job.refresh_from_db()
    assert job.state == "previewed" and BulkJob.objects.count() == 1
    assert not HandlerPause.objects.exists()


def test_without_operate_the_pages_refuse_every_write(client, viewer, operator, no_enqueue):
    stored_events(2)
    job = bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={})
    client.force_login(viewer)
    for path, body in (
        ("/ops/jobs/new/", {"kind": "replay_raw_events"}),
        (f"/ops/jobs/{job.id}/start/", {}),
        (f"/ops/jobs/{job.id}/cancel/", {}),
        ("/ops/pauses/pause/", {"source": "github"}),
        ("/ops/pauses/resume/", {"source": "github"}),
    ):
        assert client.post(path, body).status_code == 403, path
    job.refresh_from_db()
    assert job.state == "previewed" and BulkJob.objects.count() == 1
    assert not HandlerPause.objects.exists()


# --- a bulk job against a paused handler ---------------------------------------------------------


def test_a_replay_job_of_a_paused_handler_runs_nothing_until_resume(
    operator, push_handler, no_enqueue, settings
):
    from console.pauses.services import handlers_pause, handlers_resume
    from ingress.deliveries import deliveries_run_due
    from ingress.handlers import all_handlers
    from ingress.models import Delivery

    settings.INBOX_RESUME_RELEASE_PER_SECOND = 1_000_000  # released at once, for the test
    events = stored_events(5)
    (handler,) = [s.name for s in all_handlers() if s.name.endswith("console_test_on_push")]
    assert handlers_pause(actor=operator, via="api", handler=handler, reason="x").succeeded == 1
    job = bulk_job_preview(actor=operator, kind="replay_raw_events", via="api", filters={})
    job = bulk_job_run(job_id=bulk_job_start(job=job, actor=operator, via="api").id)
    assert (job.state, job.succeeded) == ("done", 5)
    # The replay armed a delivery per event; the inbox holds them instead of running them.
    deliveries_run_due()
    assert push_handler.calls == []
    assert set(Delivery.objects.values_list("status", flat=True)) == {"held"}
    assert Delivery.objects.filter(attempts=0).count() == 5  # nothing charged
    assert handlers_resume(actor=operator, via="api", handler=handler).succeeded == 1
    deliveries_run_due()
    assert sorted(push_handler.calls) == [e.id for e in events]


# --- page bounds on every console list ------------------------------------------------------


def test_an_offset_past_the_bound_is_a_400_naming_it(api):
    stored_events(1)
    response = api.get("/api/raw-events/", {"offset": "100000000000000000000"})
    assert response.status_code == 400, response.content[:300]
    assert list(response.json()["errors"]) == ["offset"]


@pytest.mark.parametrize("path", ["/api/jobs/", "/api/operator-actions/", "/api/deliveries/"])
def test_cursor_lists_refuse_an_offset_and_a_forged_cursor(api, path):
    # An offset is not how these lists page (a cursor is): named, not ignored.
    response = api.get(path, {"offset": "10"})
    assert response.status_code == 400 and list(response.json()["errors"]) == ["offset"]
    forged = api.get(path, {"cursor": "x"})
    assert forged.status_code == 404 and forged["Content-Type"] == "application/problem+json"


@pytest.mark.parametrize(
    "path", ["/api/jobs/", "/api/raw-events/", "/api/operator-actions/", "/api/deliveries/"]
)
def test_a_huge_limit_is_capped_not_a_500(api, path):
    stored_events(2)
    response = api.get(path, {"limit": "100000000000000000000"})
    assert response.status_code == 200, response.content[:300]


@pytest.mark.django_db(transaction=True)
def test_pause_clicked_twice_at_once_pauses_once_and_records_the_other_as_refused(
    operator, monkeypatch
):
    from console.pauses import services as pauses

    # Both clicks read "not paused yet" before either inserts: the race the unique
    # constraint on an active pause decides. Widened so that it always happens here.
    real_create = HandlerPause.objects.create
    both_read = threading.Barrier(2)

    def create(**fields):
        with contextlib.suppress(threading.BrokenBarrierError):
            both_read.wait(5)
        return real_create(**fields)

    monkeypatch.setattr(HandlerPause.objects, "create", create)
    results = _in_threads(
        [lambda: pauses.handlers_pause(actor=operator, via="api", source="github", reason="x")] * 2
    )
    assert all(isinstance(r, OperatorAction) for r in results), results
    outcomes = sorted(r.outcome for r in results)
    assert outcomes == ["refused", "succeeded"], results
    assert HandlerPause.objects.filter(source="github", resumed_at__isnull=True).count() == 1
    # Neither record is left `running`.
    assert not OperatorAction.objects.filter(finished_at__isnull=True).exists()
