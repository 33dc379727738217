"""Our own database fails during dispatch: no row dead, no recap failed (issue 9, finding 2).

Before issue 9, the dispatcher locked the breaker row (SELECT … FOR UPDATE) once per
dispatch, and ran every exception through a table that called OperationalError
"unclassified" → permanent → dead → recap `failed`. A statement timeout on that lock, or a
restart of PostgreSQL, failed paid recaps for good.

Real processes: the dispatcher is `manage.py dispatch_side_effects` as production runs it,
in a subprocess, against the fake render service over HTTP.

- a lock on the breaker row held by another connection for the whole run, with the
  dispatcher's statement_timeout at 500 ms (the shared server, the test database);
- PostgreSQL restarted (fast, then immediate) while the long-running dispatcher works
  through a backlog (a throw-away cluster, tests/support/pg_cluster.py).

About 45 s together on 2 cores. Run alone with `-m faults`.
"""

import os
import time

import psycopg
import pytest
from django.db import connection

from fakes.renderer import FakeRenderer
from tests.support.pg_cluster import throwaway_cluster
from tests.support.processes import app_env, manage, migrate, start_manage

pytestmark = pytest.mark.faults

SECRET = os.environ["RENDERER_WEBHOOK_SECRET"]


def _dispatcher_env(database_url: str, fake: FakeRenderer, **extra: str) -> dict[str, str]:
    return app_env(
        database_url,
        RENDER_SERVICE_URL=fake.url,
        RENDER_CALLBACK_URL="http://127.0.0.1:9/webhooks/renderer/",
        RENDER_HEALTH_TIMEOUT_SECONDS="2",
        RENDER_READ_TIMEOUT_SECONDS="2",
        RENDER_TIMEOUT_SECONDS="2",
        RENDER_MAX_CONCURRENCY="4",
        OUTBOX_DISPATCH_BUDGET_SECONDS="10",
        OUTBOX_STALE_PROCESSING_SECONDS="12",
        OUTBOX_BACKOFF_BASE_SECONDS="0.5",
        OUTBOX_BACKOFF_CAP_SECONDS="1",
        OUTBOX_IDLE_SLEEP_SECONDS="0.3",
        LOG_LEVEL="WARNING",
        **extra,
    )


# Paid recaps, made by the application's own payment service inside the target database.
_MAKE_PAID = """
from django.contrib.auth import get_user_model
from recaps.models import Event, Photo, RecapVideo
from recaps.services import recap_mark_paid
buyer = get_user_model().objects.create(username="faults-buyer")
event = Event.objects.create(title="faults")
Photo.objects.bulk_create(Photo(event=event, storage_key=f"p/{n}.jpg") for n in range(6))
recaps = RecapVideo.objects.bulk_create(RecapVideo(event=event, buyer=buyer) for _ in range({n}))
for recap in recaps:
    recap_mark_paid(recap_id=recap.id, payment_reference="pi_" + recap.id.hex[:16])
"""

_COUNTS = (
    "SELECT "
    "(SELECT count(*) FROM recap_side_effects WHERE status = 'done'), "
    "(SELECT count(*) FROM recap_side_effects WHERE status = 'dead'), "
    "(SELECT count(*) FROM recap_videos WHERE status = 'failed'), "
    "(SELECT count(*) FROM recap_side_effects)"
)


def _renders_once_each(fake: FakeRenderer, rows: int) -> None:
    assert len(fake.renders) == rows
    recaps = [render.recap_id for render in fake.renders.values()]
    assert len(set(recaps)) == rows  # one render per recap, one key each


@pytest.mark.django_db(transaction=True)
def test_a_held_lock_on_the_breaker_row_fails_no_recap(tmp_path):
    from outbox.models import CircuitBreaker
    from recaps.models import RecapStatus, RecapVideo
    from tests.recaps.factories import EventFactory, RecapFactory
    from tests.recaps.fixtures import pay

    event = EventFactory.create()
    for _ in range(12):
        pay(RecapFactory.create(event=event))
    # A breaker with a streak under way: the first success wants to write it.
    CircuitBreaker.objects.create(
        name="render-service", consecutive_failures=1, failing_rows=[999999]
    )
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    with FakeRenderer(secret=SECRET, callbacks=False) as fake:
        env = _dispatcher_env(url, fake, DATABASE_STATEMENT_TIMEOUT_MS="500")
        with psycopg.connect(url.replace("postgres://", "postgresql://")) as holder:
            holder.execute("SELECT 1 FROM outbox_circuit_breakers FOR UPDATE")
            out = manage("dispatch_side_effects", "--once", env=env, timeout=60).stdout
            holder.rollback()
        assert "claimed 12: done 12" in out, out
        assert not RecapVideo.objects.filter(status=RecapStatus.FAILED).exists()
        assert set(RecapVideo.objects.values_list("status", flat=True)) == {RecapStatus.RENDERING}
        _renders_once_each(fake, 12)


@pytest.mark.django_db(transaction=True)
def test_postgresql_restarted_mid_run_fails_no_recap(tmp_path):
    rows = 160
    with (
        throwaway_cluster(prefix="h3") as cluster,
        FakeRenderer(secret=SECRET, callbacks=False) as fake,
    ):
        cluster.createdb("eventdrop")
        env = _dispatcher_env(cluster.url("eventdrop"), fake)
        migrate(env)
        manage("shell", "-c", _MAKE_PAID.format(n=rows), env=env)
        # Each render takes a moment, so the run is busy when the database goes away.
        fake.configure(mode="slow", delay=0.05)
        dispatcher = start_manage(["dispatch_side_effects"], env, log=tmp_path / "dispatch.log")
        try:
            deadline = time.monotonic() + 30
            while len(fake.renders) < rows // 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert 0 < len(fake.renders) < rows, "the restart must hit the run mid-way"
            cluster.restart("fast")
            time.sleep(1.0)
            cluster.restart("immediate")  # a crash: no shutdown checkpoint
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    counts = cluster.psql(_COUNTS, db="eventdrop")
                    done, dead, failed, total = map(int, counts.split("|"))
                except RuntimeError:
                    done, dead, failed, total = 0, 0, 0, rows
                if done == total == rows:
                    break
                time.sleep(0.5)
            assert dispatcher.alive, dispatcher.output()[-3000:]
        finally:
            dispatcher.stop()
        assert (done, dead, failed) == (rows, 0, 0), dispatcher.output()[-3000:]
        _renders_once_each(fake, rows)
