"""The ACK roll-up: the receive path's histogram added up per source and hour by whoever reads
it for /metrics or /ops/ (no thread), each ACK once, for the ops page's 24 h chart."""

import re
import threading
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import OperationalError, connection
from prometheus_client import Histogram

from console.models import ACK_ROLLUP_BUCKETS, AckLatencyHour, AckRollupMark
from console.ops import ack_rollup
from console.ops.ack_rollup import (
    BOUNDS,
    ack_rollup_add,
    ack_rollup_collect,
    histogram_bucket_counts,
)
from console.ops.figures import hourly_ack_p99
from ingress.receive import ACK_SECONDS
from tests.console.conftest import grant
from tests.support.processes import app_env, free_port, start_procfile

NOW = datetime(2026, 12, 1, 10, 30, tzinfo=UTC)
HOUR_10 = datetime(2026, 12, 1, 10, tzinfo=UTC)
N_BUCKETS = len(ACK_ROLLUP_BUCKETS)


def histogram() -> Histogram:
    return Histogram("ack_test_seconds", "test", ["source"], buckets=BOUNDS[:-1], registry=None)


def counts(**by_column: int) -> list[int]:
    return [by_column.get(column, 0) for _, column in ACK_ROLLUP_BUCKETS]


def test_the_roll_up_columns_are_the_ack_histograms_buckets():
    assert tuple(ACK_SECONDS._upper_bounds) == BOUNDS


def test_bucket_counts_are_per_bucket_not_cumulative():
    h = histogram()
    for seconds in (0.0005, 0.003, 0.003, 0.2, 30):
        h.labels(source="stripe").observe(seconds)
    assert histogram_bucket_counts(h) == {
        "stripe": counts(le_1ms=1, le_5ms=2, le_250ms=1, le_inf=1)
    }


def rolled_up() -> dict[tuple[str, datetime], list[int]]:
    return {(row.source, row.hour): row.bucket_counts() for row in AckLatencyHour.objects.all()}


@pytest.mark.django_db
def test_each_ack_is_added_once_and_a_failed_collection_loses_nothing(monkeypatch):
    h = histogram()
    h.labels(source="stripe").observe(0.003)
    assert ack_rollup_collect(h, now=NOW, key="host:run") == 1
    assert rolled_up() == {("stripe", HOUR_10): counts(le_5ms=1)}
    assert ack_rollup_collect(h, now=NOW, key="host:run") == 0  # nothing new, nothing added

    h.labels(source="stripe").observe(0.2)
    h.labels(source="github").observe(0.02)

    def down(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(ack_rollup, "_write", down)
    with pytest.raises(OperationalError):
        ack_rollup_collect(h, now=NOW, key="host:run")
    monkeypatch.undo()
    later = NOW + timedelta(hours=1)
    h.labels(source="stripe").observe(0.2)
    assert ack_rollup_collect(h, now=later, key="host:run") == 2
    assert rolled_up() == {
        ("stripe", HOUR_10): counts(le_5ms=1),
        ("stripe", HOUR_10 + timedelta(hours=1)): counts(le_250ms=2),
        ("github", HOUR_10 + timedelta(hours=1)): counts(le_25ms=1),
    }


@pytest.mark.django_db
def test_a_new_run_of_the_histogram_counts_from_zero():
    before = histogram()
    for _ in range(3):
        before.labels(source="stripe").observe(0.003)
    ack_rollup_collect(before, now=NOW, key="host:run")
    # The same key with fewer ACKs than its mark (a histogram that started again): all of it.
    again = histogram()
    again.labels(source="stripe").observe(0.003)
    ack_rollup_collect(again, now=NOW, key="host:run")
    assert rolled_up() == {("stripe", HOUR_10): counts(le_5ms=4)}


def test_a_histogram_of_other_buckets_is_not_rolled_up():
    other = Histogram("other_seconds", "test", ["source"], buckets=(0.1, 1.0), registry=None)
    other.labels(source="stripe").observe(0.05)
    assert histogram_bucket_counts(other) == {}


@pytest.mark.django_db
def test_p99_per_hour_comes_from_the_buckets():
    AckLatencyHour.objects.create(source="stripe", hour=HOUR_10, le_10ms=98, le_500ms=2)
    AckLatencyHour.objects.create(
        source="stripe", hour=HOUR_10 - timedelta(hours=2), le_50ms=50, le_100ms=50
    )
    AckLatencyHour.objects.create(source="github", hour=HOUR_10, le_inf=5)
    # Outside the 24 h window: not charted.
    AckLatencyHour.objects.create(source="stripe", hour=HOUR_10 - timedelta(hours=24), le_inf=9)
    series = hourly_ack_p99(now=NOW).series
    # Rank 99 of 100 is the first of the 2 in (250 ms, 500 ms]: halfway through it.
    assert series["stripe"][-1] == pytest.approx(0.375)
    # Rank 99 is 49 of the 50 in (50 ms, 100 ms].
    assert series["stripe"][-3] == pytest.approx(0.05 + 0.05 * 49 / 50)
    assert series["stripe"][-2] is None and series["stripe"][0] is None
    # Past the last finite bound: that bound, as histogram_quantile answers.
    assert series["github"][-1] == 10.0


@pytest.mark.django_db(transaction=True)
def test_two_readings_at_once_add_each_ack_once_on_postgresql():
    rounds = 15
    h = histogram()
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def one_scrape(bucket_seconds: float) -> None:
        try:
            start.wait()
            for _ in range(rounds):
                h.labels(source="stripe").observe(bucket_seconds)
                h.labels(source="github").observe(0.003)
                ack_rollup_collect(h, now=NOW, key="host:shared")
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=one_scrape, args=(s,)) for s in (0.003, 0.2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert rolled_up() == {
        ("stripe", HOUR_10): counts(le_5ms=rounds, le_250ms=rounds),
        ("github", HOUR_10): counts(le_5ms=2 * rounds),
    }
    ack_rollup_add({("github", HOUR_10): counts(le_inf=1)})
    assert AckLatencyHour.objects.get(source="github").le_inf == 1


def _database_url() -> str:
    db = connection.settings_dict
    credentials = f"{db['USER']}:{db['PASSWORD']}" if db.get("PASSWORD") else db["USER"]
    return f"postgres://{credentials}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def _post_webhook(port: int) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/webhooks/stripe/",
        data=b'{"id": "evt_1"}',
        headers={"Stripe-Signature": "t=1700000000,v1=00", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def _scrape(port: int) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


TOKEN = "ack-rollup-test-token-0123456789abcdef"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_web_server_rolls_up_when_scraped_and_the_ops_page_charts_it(
    client, django_user_model, tmp_path
):
    webhooks = 12
    port = free_port()
    env = app_env(
        _database_url(),
        WEB_CONCURRENCY="2",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
        METRICS_BEARER_TOKEN=TOKEN,
    )
    with start_procfile("web", env, port=port, log=tmp_path / "web.log") as web:
        web.wait_listening(port, timeout=30)
        assert [_post_webhook(port) for _ in range(webhooks)] == [202] * webhooks
        # Two scrapes, whichever process answers each: both processes' ACKs, each once.
        assert [_scrape(port), _scrape(port)] == [200, 200], web.output()
        rows = list(AckLatencyHour.objects.filter(source="stripe"))
        assert sum(sum(row.bucket_counts()) for row in rows) == webhooks, web.output()

    viewer = django_user_model.objects.create_user("ops", is_staff=True)
    client.force_login(grant(viewer, "console.view_ops"))
    page = client.get("/ops/").content.decode()
    svg = page[page.index('id="chart-ack"') : page.index("</svg>", page.index('id="chart-ack"'))]
    assert "ACK latency p99 < 250 ms" in svg or "red from 250 ms" in svg
    points = re.findall(r'class="ops-point"[^>]*><title>(\d\d:00) stripe: ([^<]+)</title>', svg)
    current = datetime.now(UTC).strftime("%H:00")
    assert points and points[-1][0] in {current, rows[-1].hour.strftime("%H:00")}
    assert "histogram_quantile" in page


@pytest.mark.django_db
def test_the_console_role_rolls_up_and_the_worker_prunes(settings):
    from kernel.db_roles import db_roles_apply, role_name

    settings.DATABASE_ROLE_PREFIX = prefix = f"edtest_{uuid.uuid4().hex[:6]}_"
    db_roles_apply()
    AckLatencyHour.objects.create(source="stripe", hour=HOUR_10 - timedelta(hours=49), le_inf=1)
    h = histogram()
    h.labels(source="stripe").observe(0.003)
    for kind, act in (
        ("console", lambda: ack_rollup_collect(h, now=NOW, key="host:run")),
        ("worker", lambda: ack_rollup.ack_rollup_prune(now=NOW)),
    ):
        with connection.cursor() as cursor:
            cursor.execute(f'SET ROLE "{role_name(kind, prefix)}"')
        try:
            act()
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET ROLE")
    assert rolled_up() == {("stripe", HOUR_10): counts(le_5ms=1)}
    assert AckRollupMark.objects.get().key == "host:run"
