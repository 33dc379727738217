"""The ops page's charts: the last 24 h per hour from one grouped query per figure, drawn as
inline SVG whose every value is also written (tooltip, legend), escaped."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.ops import charts
from console.ops.figures import CHART_HOURS, chart_hours, hourly_dead, hourly_lags, hourly_volume
from ingress.models import Delivery, RawEvent
from outbox.models import RecapSideEffect
from tests.console.conftest import grant
from tests.console.samples import paid_recap
from tests.console.test_ops import raw_event


def total(counts: list[float | None]) -> float:
    """A count series' sum: every hour of a count series has a number (0 when empty)."""
    assert None not in counts
    return sum(count or 0 for count in counts)


pytestmark = pytest.mark.django_db

# Half past ten: the current hour bucket is 10:00, the first 11:00 of the day before.
NOW = datetime(2026, 12, 1, 10, 30, tzinfo=UTC)


def at(hours_ago: float) -> timedelta:
    return timedelta(hours=hours_ago)


def test_the_hours_are_24_buckets_ending_with_the_current_one():
    hours = chart_hours(now=NOW)
    assert len(hours) == CHART_HOURS == 24
    assert hours[-1] == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert hours[0] == datetime(2026, 11, 30, 11, tzinfo=UTC)


def test_volume_per_source_and_rejections_per_hour_in_one_query():
    RawEvent.objects.bulk_create(
        [
            raw_event(NOW, ago=timedelta(minutes=5)),  # 10:25, current hour
            raw_event(NOW, ago=timedelta(minutes=20)),  # 10:10
            raw_event(NOW, source="stripe", ago=timedelta(minutes=40), status="rejected",
                      reason="bad_signature"),  # 09:50
            raw_event(NOW, ago=at(23)),  # 11:30 the day before: the first bucket
            raw_event(NOW, ago=at(24)),  # 10:30 the day before: outside the window
        ]
    )  # fmt: skip
    with CaptureQueriesContext(connection) as captured:
        volume = hourly_volume(now=NOW)
    assert len(captured) == 1
    assert "GROUP BY" in captured[0]["sql"].upper()
    assert volume.series["github"][-1] == 2
    assert volume.series["github"][0] == 1
    assert total(volume.series["github"]) == 3
    assert volume.series["stripe"][-2] == 1
    assert volume.series["rejected (all sources)"][-2] == 1
    assert total(volume.series["rejected (all sources)"]) == 1


def test_lag_p95_per_hour_received_waiting_events_count_with_their_wait():
    RawEvent.objects.bulk_create(
        [
            *(raw_event(NOW, ago=at(3), verify_lag=1, handle_lag=2) for _ in range(19)),
            raw_event(NOW, ago=at(3), verify_lag=21, handle_lag=2),
            # Still pending since 10:20: it has waited 600 s so far.
            raw_event(NOW, ago=timedelta(minutes=10), status="pending"),
        ]
    )
    with CaptureQueriesContext(connection) as captured:
        lags = hourly_lags(now=NOW)
    assert len(captured) == 1
    verification = lags.series["verification lag p95"]
    # percentile_cont: rank 0.95 * 19 = 18.05, between 1 s and 21 s: 1 + 0.05 * 20.
    assert verification[-4] == pytest.approx(2.0)
    assert verification[-1] == pytest.approx(600)
    assert lags.series["processing lag p95"][-4] == pytest.approx(2)
    assert verification[-2] is None  # nothing received from 09:00 to 10:00


def test_dead_rows_per_hour_by_when_they_gave_up(client, admin_user):
    [event] = RawEvent.objects.bulk_create([raw_event(NOW, ago=at(5))])
    Delivery.objects.bulk_create(
        [
            Delivery(raw_event=event, handler="h.a", status="dead", last_error="boom",
                     finished_at=NOW - at(1)),
            Delivery(raw_event=event, handler="h.b", status="dead", last_error="boom",
                     finished_at=NOW - at(30)),  # older than the window
            Delivery(raw_event=event, handler="h.c", status="done", finished_at=NOW - at(1)),
        ]
    )  # fmt: skip
    row = RecapSideEffect.objects.get(recap=paid_recap(client, admin_user))
    RecapSideEffect.objects.filter(pk=row.pk).update(
        status="dead", last_error="HTTP 500", finished_at=NOW - timedelta(minutes=1)
    )
    dead = hourly_dead(now=NOW)
    assert dead.series["dead deliveries"][-2] == 1
    assert total(dead.series["dead deliveries"]) == 1
    assert dead.series["dead side effects"][-1] == 1


def test_a_chart_writes_every_value_and_escapes_every_name():
    hours = chart_hours(now=NOW)
    chart = charts.stacked_bars(
        key="volume",
        title="Events <per> hour",
        hours=hours,
        series={"<script>alert(1)</script>": [0] * 23 + [7], "b": [1] * 24},
    )
    svg = str(chart.svg)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert 'aria-label="Events &lt;per&gt; hour"' in svg
    assert svg.count('class="ops-bar"') == 25
    assert "10:00 &lt;script&gt;alert(1)&lt;/script&gt;: 7" in svg
    assert "&lt;script&gt;" in str(charts.legend_html(chart))


def test_a_line_chart_leaves_a_gap_for_an_hour_without_data_and_draws_the_red_line():
    hours = chart_hours(now=NOW)
    points = [1.0] * 10 + [None] + [2.0] * 13
    chart = charts.lines(
        key="lags", title="lag", hours=hours, series={"p95": points}, fmt=str,
        red_lines={"red from 60 s": 60.0},
    )  # fmt: skip
    svg = str(chart.svg)
    assert svg.count("<polyline") == 2
    assert svg.count('class="ops-point"') == 23
    assert 'class="ops-red-line"' in svg and "red from 60 s" in svg


def test_the_ops_page_shows_the_five_charts(client, django_user_model):
    viewer = django_user_model.objects.create_user("ops", is_staff=True)
    client.force_login(grant(viewer, "console.view_ops"))
    RawEvent.objects.bulk_create([raw_event(datetime.now(UTC), ago=timedelta(minutes=1))])
    page = client.get("/ops/").content.decode()
    for key in ("ack", "volume", "rejected", "lags", "dead"):
        assert f'id="chart-{key}"' in page
    assert "DESIGN.md" not in page
    assert 'class="ops-bar"' in page
