"""Issue 27 on real processes: our own database is never a delivery's death sentence, and a
handler's effect happens once.

- The lock story: `recap_videos` locked (a migration, VACUUM FULL, an operator's long
  transaction) for many times the delivery backoff, with a 1 s statement timeout, while
  Stripe's `checkout.session.completed` arrives through the web server. Before: 8 charged
  statement timeouts, the delivery `dead`, the recap `pending_payment` after the lock was
  gone. Now: the delivery waits uncharged, and after the lock the recap is paid and
  rendered; 0 dead deliveries.
- PostgreSQL restarted mid-batch several times (a throw-away cluster): no delivery dead,
  every recap paid once.
- Two `process_inbox` workers and a batch that outlives DELIVERY_STALE_AFTER_SECONDS (its
  handler waits on a row lock): the batch holds its claims, nobody re-arms them, the
  handler's effect happens once, and the key's next event waits its turn.

Faults are driven by what the processes did (attempts recorded, rows done, a claim older
than the threshold), never by the clock.
"""

import json
import os
from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone

from fakes.renderer import FakeRenderer
from ingress.deliveries import deliveries_rearm_orphaned
from ingress.models import Delivery, DeliveryAttempt
from outbox.models import RecapSideEffect
from recaps.models import RecapStatus, RecapVideo
from tests.recaps.factories import EventFactory, RecapFactory
from tests.support.pg_cluster import throwaway_cluster
from tests.support.processes import (
    app_env,
    free_port,
    manage,
    migrate,
    settings_database_url,
    start_manage,
    start_procfile,
    wait_until,
)
from tests.support.signing import checkout_session_event, post_signed_stripe
from tests.support.sql import database_dsn

CHECKOUT = "recaps.handlers.record_checkout_session"


def delivery_states() -> dict[str, object]:
    return {
        "deliveries": list(Delivery.objects.values_list("status", "attempts", "last_error")),
        "attempts": list(DeliveryAttempt.objects.values_list("outcome", flat=True)),
    }


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_locked_table_for_many_backoffs_loses_no_payment(tmp_path):
    port = free_port()
    recap = RecapFactory.create(event=EventFactory.create())
    with FakeRenderer(secret=os.environ["RENDERER_WEBHOOK_SECRET"], complete_after=0.1) as fake:
        env = app_env(
            settings_database_url(),
            DATABASE_STATEMENT_TIMEOUT_MS="1000",
            DELIVERY_BACKOFF_BASE_SECONDS="0.5",
            DELIVERY_BACKOFF_CAP_SECONDS="1",
            INBOX_IDLE_SLEEP_SECONDS="0.05",
            OUTBOX_IDLE_SLEEP_SECONDS="0.1",
            OUTBOX_BACKOFF_BASE_SECONDS="0.2",
            OUTBOX_BACKOFF_CAP_SECONDS="0.5",
            RENDER_BREAKER_COOLDOWN_SECONDS="0.5",
            RENDER_SERVICE_URL=fake.url,
            RENDER_CALLBACK_URL=f"http://127.0.0.1:{port}/webhooks/renderer/",
            WEB_CONCURRENCY="1",
            LOG_LEVEL="WARNING",
        )
        processes = [
            start_procfile("web", env, port=port, log=tmp_path / "web.log"),
            start_manage(["process_inbox"], env, log=tmp_path / "inbox.log"),
            start_manage(["dispatch_side_effects"], env, log=tmp_path / "dispatcher.log"),
        ]
        try:
            processes[0].wait_listening(port, timeout=60)
            with psycopg.connect(database_dsn()) as operator:
                operator.execute("LOCK TABLE recap_videos IN ACCESS EXCLUSIVE MODE")
                post_signed_stripe(
                    f"http://127.0.0.1:{port}", checkout_session_event(str(recap.id))
                )
                # Held until the delivery has waited out more statement timeouts than
                # DELIVERY_MAX_ATTEMPTS (8) would ever have allowed it.
                # Read between two attempts, while the table is still locked: once it is
                # released the inbox may claim the row again at once ('processing').
                wait_until(
                    lambda: (
                        DeliveryAttempt.objects.filter(outcome="released").count() >= 10
                        and Delivery.objects.get(handler=CHECKOUT).status == "pending"
                    ),
                    "ten statement timeouts of the checkout handler",
                    delivery_states,
                    processes,
                )
                delivery = Delivery.objects.get(handler=CHECKOUT)
                operator.rollback()
            assert delivery.status == "pending" and delivery.attempts == 0
            assert delivery.last_error.startswith("OperationalError: ")
            wait_until(
                lambda: RecapVideo.objects.get(pk=recap.pk).status == RecapStatus.READY,
                "the recap paid, rendered and ready",
                delivery_states,
                processes,
            )
        finally:
            for process in processes:
                process.stop()
    assert not Delivery.objects.filter(status="dead").exists()
    delivery = Delivery.objects.get(handler=CHECKOUT)
    # One charged attempt, the one that ran; every timeout before it released uncharged.
    assert (delivery.status, delivery.attempts) == ("done", 1)
    outcomes = list(delivery.history.order_by("number").values_list("outcome", flat=True))
    assert outcomes[-1] == "done" and set(outcomes[:-1]) == {"released"}
    recap.refresh_from_db()
    assert recap.payment_reference.startswith("pi_cs_")
    assert RecapSideEffect.objects.get(recap=recap).status == "done"


_MAKE_RECAPS = """
import json
from django.contrib.auth import get_user_model
from recaps.models import Event, Photo, RecapVideo
buyer = get_user_model().objects.create(username="restart-buyer")
event = Event.objects.create(title="restarts")
Photo.objects.bulk_create(Photo(event=event, storage_key=f"p/{{n}}.jpg") for n in range(6))
recaps = RecapVideo.objects.bulk_create(RecapVideo(event=event, buyer=buyer) for _ in range({n}))
print(json.dumps([str(recap.id) for recap in recaps]))
"""
_SETTLE = "from ingress.inbox import raw_events_verify_batch; raw_events_verify_batch(limit=10000)"
# The settled deliveries become due one after another, 25 a second: the run lasts long
# enough for restarts to land in it, paced by the rows, not by a sleep of ours.
_PACE = (
    "UPDATE ingress_delivery AS d SET next_attempt_at = now() + p.n * interval '40 ms' "
    "FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM ingress_delivery) AS p "
    "WHERE d.id = p.id"
)
_COUNTS = (
    "SELECT (SELECT count(*) FROM ingress_delivery WHERE status = 'done'), "
    "(SELECT count(*) FROM ingress_delivery WHERE status = 'dead'), "
    "(SELECT count(*) FROM recap_videos WHERE status = 'paid'), "
    "(SELECT count(*) FROM ingress_delivery WHERE status = 'processing')"
)


@pytest.mark.faults
@pytest.mark.django_db(transaction=True)
def test_postgresql_restarted_mid_batch_several_times_kills_no_delivery(tmp_path):
    rows = 300
    with throwaway_cluster(prefix="i27") as cluster:
        cluster.createdb("eventdrop")
        port = free_port()
        env = app_env(
            cluster.url("eventdrop"),
            INBOX_BATCH_SIZE="5",
            INBOX_IDLE_SLEEP_SECONDS="0.05",
            DELIVERY_STALE_AFTER_SECONDS="2",
            DELIVERY_BACKOFF_BASE_SECONDS="0.2",
            DELIVERY_BACKOFF_CAP_SECONDS="0.5",
            WEB_CONCURRENCY="1",
            LOG_LEVEL="WARNING",
        )
        migrate(env)
        made = manage("shell", "-c", _MAKE_RECAPS.format(n=rows), env=env).stdout
        recap_ids = json.loads(made.strip().splitlines()[-1])
        web = start_procfile("web", env, port=port, log=tmp_path / "web.log")
        try:
            web.wait_listening(port, timeout=60)
            for recap_id in recap_ids:
                post_signed_stripe(f"http://127.0.0.1:{port}", checkout_session_event(recap_id))
        finally:
            web.stop()
        manage("shell", "-c", _SETTLE, env=env)
        cluster.psql(_PACE, db="eventdrop")

        def counts() -> tuple[int, int, int, int]:
            try:
                done, dead, paid, processing = cluster.psql(_COUNTS, db="eventdrop").split("|")
            except RuntimeError:  # the cluster is restarting
                return (-1, -1, -1, -1)
            return int(done), int(dead), int(paid), int(processing)

        worker = start_manage(["process_inbox"], env, log=tmp_path / "inbox.log")
        try:
            for quarter, mode in ((1, "immediate"), (2, "fast"), (3, "immediate")):
                target = quarter * rows // 4

                def reached(target: int = target) -> bool:
                    return counts()[0] >= target

                wait_until(
                    reached,
                    f"{quarter} quarter(s) of the deliveries done",
                    counts,
                    [worker],
                )
                assert counts()[0] < rows, "the restart must land mid-run"
                cluster.restart(mode)  # `immediate` is a crash: no shutdown checkpoint
            wait_until(lambda: counts()[0] == rows, "every delivery done", counts, [worker])
        finally:
            worker.stop()
        done, dead, paid, processing = counts()
        assert (done, dead, paid, processing) == (rows, 0, rows, 0), worker.output()[-3000:]
        charged = cluster.psql(
            "SELECT count(*) FROM ingress_delivery WHERE attempts <> 1", db="eventdrop"
        )
        assert charged == "0"  # a restart under a batch charged nobody
        deaths = cluster.psql(
            "SELECT count(*) FROM ingress_delivery WHERE worker_deaths <> 0", db="eventdrop"
        )
        assert deaths == "0"  # and was never taken for a worker's death (issue 29)
        outbox_rows = cluster.psql("SELECT count(*) FROM recap_side_effects", db="eventdrop")
        assert outbox_rows == str(rows)  # each handler's effect once


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_workers_and_a_batch_outliving_the_stale_threshold_run_each_handler_once(
    tmp_path,
):
    event = EventFactory.create()
    slow, *others = [RecapFactory.create(event=event) for _ in range(5)]
    env = app_env(
        settings_database_url(),
        DELIVERY_STALE_AFTER_SECONDS="2",
        DATABASE_STATEMENT_TIMEOUT_MS="60000",
        INBOX_BATCH_SIZE="1",
        INBOX_IDLE_SLEEP_SECONDS="0.05",
        LOG_LEVEL="WARNING",
    )
    port = free_port()
    web = start_procfile("web", env, port=port, log=tmp_path / "web.log")
    try:
        web.wait_listening(port, timeout=60)
        with psycopg.connect(database_dsn()) as operator:
            # The slow recap's handler will wait on this row lock: its batch outlives the
            # stale threshold many times over.
            operator.execute("SELECT 1 FROM recap_videos WHERE id = %s FOR UPDATE", [slow.id])
            post_signed_stripe(f"http://127.0.0.1:{port}", checkout_session_event(str(slow.id)))
            # The same checkout again, later (Stripe's async success): the key's next
            # event, which must wait for the first.
            post_signed_stripe(
                f"http://127.0.0.1:{port}",
                checkout_session_event(
                    str(slow.id), event_type="checkout.session.async_payment_succeeded"
                ),
            )
            for recap in others:
                post_signed_stripe(
                    f"http://127.0.0.1:{port}", checkout_session_event(str(recap.id))
                )
            workers = [
                start_manage(["process_inbox"], env, log=tmp_path / f"inbox-{n}.log")
                for n in range(2)
            ]
            try:
                head = Delivery.objects.filter(handler=CHECKOUT, ordering_key__endswith=slow.id.hex)

                def blocked_past_the_threshold() -> bool:
                    running = head.filter(status="processing").first()
                    others_done = Delivery.objects.filter(status="done").exclude(
                        ordering_key__endswith=slow.id.hex
                    ).count() == len(others)
                    return (
                        running is not None
                        and running.claimed_at is not None
                        and running.claimed_at < timezone.now() - timedelta(seconds=4)
                        and others_done
                    )

                wait_until(
                    blocked_past_the_threshold,
                    "the slow batch past twice the stale threshold, the others done",
                    delivery_states,
                    [web, *workers],
                )
                (running,) = head.filter(status="processing")
                # A third worker's re-arm, with everything stale by its own clock, finds
                # the row held by its live batch and leaves it: no second run under it.
                assert deliveries_rearm_orphaned(now=timezone.now() + timedelta(days=1)) == 0
                # The key's next event waits behind its running head.
                assert head.exclude(pk=running.pk).get().status == "pending"
                operator.rollback()
                wait_until(
                    lambda: head.filter(status="done").count() == 2,
                    "both deliveries of the slow key done",
                    delivery_states,
                    [web, *workers],
                )
            finally:
                for worker in workers:
                    worker.stop()
    finally:
        web.stop()
    for delivery in Delivery.objects.filter(handler=CHECKOUT):
        assert (delivery.status, delivery.attempts) == ("done", 1)
        # A loaded machine may take longer than the 2 s threshold between a claim and its
        # batch's lock: the claim is re-armed and taken again (total_attempts 2, ingress.W011
        # says so), and the fence still lets one run through.
        assert list(delivery.history.values_list("outcome", flat=True)) == ["done"]
    first, second = DeliveryAttempt.objects.filter(delivery__in=head).order_by("started_at")
    assert second.started_at >= first.finished_at  # one delivery of the key at a time
    assert RecapSideEffect.objects.filter(recap=slow).count() == 1
    assert RecapVideo.objects.filter(status=RecapStatus.PAID).count() == 5
