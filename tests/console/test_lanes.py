"""Fair shares and limits, visible (issue 41): per source and per handler the backlog, what is
in flight, the pace and the time to clear, the limits now, on /api/queues/, /ops/ and
/metrics; a bulk job's preview says how long a rate-limited handler takes to clear it."""

from datetime import timedelta

import pytest
from django.utils import timezone

from console.jobs.services import bulk_job_preview
from console.models import BulkJobKind
from ingress.deliveries import deliveries_run_due
from ingress.models import Delivery, HandlerPace
from tests.console.test_api_reads import api, reader  # noqa: F401 (fixtures)
from tests.ingress.test_fair_share import pending_deliveries, store_github
from tests.ingress.test_handler_limits import Downstream, handlers  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def test_queues_show_each_source_and_each_handler_with_its_limits(api, handlers, settings):  # noqa: F811
    settings.BULK_JOB_REPLAY_SLO_SECONDS = 120
    paced = handlers("lane_paced", Downstream(), rate=2, concurrency=3)
    free = handlers("lane_free", Downstream())
    now = timezone.now()
    pending_deliveries(paced, 40, due=now - timedelta(seconds=1))
    pending_deliveries(free, 5, due=now)
    store_github(2, prefix="lane")  # two raw events to verify
    deliveries_run_due(limit=500)  # the paced one takes its burst, the free one all of it
    HandlerPace.objects.filter(handler=paced).update(
        not_before=timezone.now() + timedelta(minutes=1)
    )
    body = api.get("/api/queues/").json()

    github = body["sources"]["github"]
    assert (github["backlog"], github["in_flight"]) == (2, 0)
    lane = body["handlers"][paced]
    assert (lane["backlog"], lane["drained"]) == (39, 1)
    assert (lane["rate_limit_per_second"], lane["concurrency_limit"]) == (2.0, 3)
    assert lane["paused_until"] is not None
    # One finished in 5 minutes: 39 waiting take far past the SLO.
    assert lane["seconds_to_clear"] == pytest.approx(39 / (1 / 300))
    assert lane["over_replay_slo"] is True
    quiet = body["handlers"][free]
    assert (quiet["backlog"], quiet["drained"], quiet["over_replay_slo"]) == (0, 5, False)


def test_the_ops_page_and_metrics_show_the_lanes(client, admin_user, handlers, settings):  # noqa: F811
    paced = handlers("lane_metrics", Downstream(), rate=4)
    pending_deliveries(paced, 10, due=timezone.now())
    client.force_login(admin_user)
    page = client.get("/ops/").content.decode()
    assert f'id="lane-handler-{paced}"' in page and "4/s" in page
    settings.METRICS_BEARER_TOKEN = "t" * 40
    metrics = client.get("/metrics", HTTP_AUTHORIZATION="Bearer " + "t" * 40).content.decode()
    assert f'eventdrop_handler_backlog{{handler="{paced}"}} 10.0' in metrics
    assert f'eventdrop_handler_rate_limit_per_second{{handler="{paced}"}} 4.0' in metrics
    assert f'eventdrop_handler_not_draining{{handler="{paced}"}} 1.0' in metrics
    assert 'eventdrop_source_backlog{source="github"}' in metrics
    assert "eventdrop_replay_slo_seconds 120.0" in metrics


def test_a_preview_says_how_long_a_rate_limited_handler_takes(admin_user, handlers, settings):  # noqa: F811
    settings.BULK_JOB_REPLAY_SLO_SECONDS = 120
    paced = handlers("lane_preview", Downstream(), rate=5)
    rows = pending_deliveries(paced, 30, due=timezone.now())
    Delivery.objects.filter(id__in=[d.id for d in rows]).update(status="dead")
    job = bulk_job_preview(
        actor=admin_user, kind=BulkJobKind.REARM_DELIVERIES, via="api", filters={"handler": paced}
    )
    assert job.breakdown["paced"] == [[paced, 30, 5, 6.0, False]]
    settings.HANDLER_LIMITS = {paced: {"rate": 0.1}}
    job = bulk_job_preview(
        actor=admin_user, kind=BulkJobKind.REARM_DELIVERIES, via="api", filters={"handler": paced}
    )
    assert job.breakdown["paced"] == [[paced, 30, 0.1, 300.0, True]]
