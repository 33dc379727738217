"""The ACK roll-up: each web process adds its histogram's deltas per (source, hour) to the
database (console/ack_rollup.py), and the ops page charts p99 per hour from the buckets.

The arithmetic with a real prometheus_client histogram and an injected writer; the upsert
on PostgreSQL from two flushers at once; and a real web process (the Procfile's line,
flushing every second) whose roll-up the ops page charts. About 10 s, most of it the server.
"""

import logging
import re
import threading
import time
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from prometheus_client import Histogram

from console.ack_rollup import BOUNDS, AckRollup, ack_rollup_add, histogram_bucket_counts
from console.models import ACK_ROLLUP_BUCKETS, AckLatencyHour
from console.ops import hourly_ack_p99
from ingress.views import ACK_SECONDS
from tests.console.conftest import grant
from tests.support.processes import app_env, free_port, start_procfile

NOW = datetime(2026, 12, 1, 10, 30, tzinfo=UTC)
HOUR_10 = datetime(2026, 12, 1, 10, tzinfo=UTC)
N_BUCKETS = len(ACK_ROLLUP_BUCKETS)


def histogram() -> Histogram:
    return Histogram("ack_test_seconds", "test", ["source"], buckets=BOUNDS[:-1], registry=None)


def counts(**by_column: int) -> list[int]:
    return [by_column.get(column, 0) for _, column in ACK_ROLLUP_BUCKETS]


class Recorder:
    """A writer that fails while `failures` lasts, then records what it was asked to add."""

    def __init__(self, failures: list[Exception] | None = None):
        self.failures = list(failures or [])
        self.added: dict[tuple[str, datetime], list[int]] = {}

    def __call__(self, rows):
        if self.failures:
            raise self.failures.pop(0)
        for key, row in rows.items():
            total = self.added.setdefault(key, [0] * N_BUCKETS)
            self.added[key] = [a + b for a, b in zip(total, row, strict=True)]


def no_prune(**_):
    return 0


def test_the_roll_up_columns_are_the_ack_histograms_buckets():
    assert tuple(ACK_SECONDS._upper_bounds) == BOUNDS


def test_bucket_counts_are_per_bucket_not_cumulative():
    h = histogram()
    for seconds in (0.0005, 0.003, 0.003, 0.2, 30):
        h.labels(source="stripe").observe(seconds)
    assert histogram_bucket_counts(h) == {
        "stripe": counts(le_1ms=1, le_5ms=2, le_250ms=1, le_inf=1)
    }


def test_each_ack_is_added_once_and_a_failed_flush_keeps_its_deltas(caplog):
    h = histogram()
    writer = Recorder()
    rollup = AckRollup(h, write=writer, prune=no_prune)
    h.labels(source="stripe").observe(0.003)
    assert rollup.flush(now=NOW) is True
    assert writer.added == {("stripe", HOUR_10): counts(le_5ms=1)}

    writer.added.clear()
    assert rollup.flush(now=NOW) is True  # nothing new: nothing added again
    assert writer.added == {}

    h.labels(source="stripe").observe(0.2)
    h.labels(source="github").observe(0.02)
    writer.failures = [OSError("down"), OSError("down"), TimeoutError()]
    with caplog.at_level(logging.INFO, logger="console.ack_rollup"):
        assert rollup.flush(now=NOW) is False
        h.labels(source="stripe").observe(0.2)
        assert rollup.flush(now=NOW + timedelta(minutes=1)) is False
        assert rollup.flush(now=NOW + timedelta(minutes=2)) is False
        assert rollup.pending == {
            ("stripe", HOUR_10): counts(le_250ms=2),
            ("github", HOUR_10): counts(le_25ms=1),
        }
        later = NOW + timedelta(hours=1)
        h.labels(source="stripe").observe(0.2)
        assert rollup.flush(now=later) is True
    assert writer.added == {
        ("stripe", HOUR_10): counts(le_250ms=2),
        ("github", HOUR_10): counts(le_25ms=1),
        ("stripe", HOUR_10 + timedelta(hours=1)): counts(le_250ms=1),
    }
    assert rollup.pending == {}
    # One line per kind of failure (not per failed flush), and one when it recovers.
    messages = [record.getMessage() for record in caplog.records]
    assert [m for m in messages if "failed" in m] == [
        "ACK roll-up flush failed (OSError); 2 row(s) kept for the next flush",
        "ACK roll-up flush failed (TimeoutError); 2 row(s) kept for the next flush",
    ]
    assert messages[-1] == "ACK roll-up flush succeeded again after OSError, TimeoutError"
    assert all("down" not in m for m in messages)


def test_a_failed_prune_after_a_written_flush_adds_nothing_twice():
    h = histogram()
    writer = Recorder()
    prunes = [OSError("prune failed")]

    def prune(**_):
        if prunes:
            raise prunes.pop()
        return 0

    rollup = AckRollup(h, write=writer, prune=prune)
    h.labels(source="stripe").observe(0.003)
    assert rollup.flush(now=NOW) is False
    assert rollup.flush(now=NOW) is True
    assert writer.added == {("stripe", HOUR_10): counts(le_5ms=1)}


def test_pending_rows_are_bounded_to_the_retention():
    h = histogram()
    rollup = AckRollup(h, write=Recorder(failures=[OSError()] * 100), prune=no_prune)
    for hours in range(60):
        h.labels(source="stripe").observe(0.003)
        rollup.flush(now=NOW + timedelta(hours=hours))
    assert len(rollup.pending) == 49  # the current hour and the 48 before it
    assert min(hour for _, hour in rollup.pending) == HOUR_10 + timedelta(hours=59 - 48)


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
def test_two_flushers_at_once_add_up_on_postgresql():
    rounds = 15
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def one_process(bucket_seconds: float) -> None:
        try:
            h = histogram()
            rollup = AckRollup(h)
            start.wait()
            for _ in range(rounds):
                h.labels(source="stripe").observe(bucket_seconds)
                h.labels(source="github").observe(0.003)
                assert rollup.flush(now=NOW) is True
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=one_process, args=(s,)) for s in (0.003, 0.2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    rows = {row.source: row.bucket_counts() for row in AckLatencyHour.objects.all()}
    assert rows == {
        "stripe": counts(le_5ms=rounds, le_250ms=rounds),
        "github": counts(le_5ms=2 * rounds),
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


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_web_server_writes_the_roll_up_and_the_ops_page_charts_it(
    client, django_user_model, tmp_path
):
    webhooks = 12
    port = free_port()
    env = app_env(_database_url(), ACK_ROLLUP_FLUSH_SECONDS="1", WEB_CONCURRENCY="2")
    with start_procfile("web", env, port=port, log=tmp_path / "web.log") as web:
        web.wait_listening(port, timeout=30)
        assert [_post_webhook(port) for _ in range(webhooks)] == [202] * webhooks
        deadline = time.monotonic() + 15
        total = 0
        while time.monotonic() < deadline:
            rows = list(AckLatencyHour.objects.filter(source="stripe"))
            total = sum(sum(row.bucket_counts()) for row in rows)
            if total >= webhooks:
                break
            time.sleep(0.25)
        # Both processes' rows add up to every ACK, each counted once.
        assert total == webhooks, web.output()

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
def test_the_flusher_adds_and_prunes_as_the_web_role(settings):
    from kernel.db_roles import db_roles_apply, role_name

    settings.DATABASE_ROLE_PREFIX = prefix = f"edtest_{uuid.uuid4().hex[:6]}_"
    db_roles_apply()
    AckLatencyHour.objects.create(source="stripe", hour=HOUR_10 - timedelta(hours=49), le_inf=1)
    h = histogram()
    h.labels(source="stripe").observe(0.003)
    with connection.cursor() as cursor:
        cursor.execute(f'SET ROLE "{role_name("web", prefix)}"')
    try:
        assert AckRollup(h).flush(now=NOW) is True
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
    assert [(row.hour, row.bucket_counts()) for row in AckLatencyHour.objects.all()] == [
        (HOUR_10, counts(le_5ms=1))
    ]
