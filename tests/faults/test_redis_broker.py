"""django-q2 on a real Redis broker, two clusters at once (issue 14, part 2).

A redis-server of our own on a free port (tests/faults/servers.py), a throw-away PostgreSQL
cluster with the real schedules (`manage.py ensure_schedules`), signed events waiting as
pending rows, and two `qcluster` processes (the Procfile's `worker` line) with
Q_BROKER=redis started at the same moment, so that their schedulers reach the due schedules
in the same second:

- each due schedule is enqueued once for its tick, by one of the two clusters, and its task
  runs once (the inbox pass verifies every pending event, once). The minute schedules' period
  is lengthened to an hour first, so that their next tick cannot fall inside the test on a
  slow machine; the test waits until every task the clusters' logs say they enqueued has
  run, not for a fixed time;
- a task message lost in Redis (FLUSHALL, as a Redis restart without persistence would)
  loses no work: the rows it was meant to nudge are still pending, untouched, and the next
  worker to look takes them.

About 45 s on 2 cores, most of it django-q2's scheduler period (30 s after start).
"""

import re
import subprocess
import time

import psycopg
import pytest

from tests.faults.servers import redis_server
from tests.support.pg_cluster import throwaway_cluster
from tests.support.processes import app_env, manage, migrate, start_procfile

pytestmark = pytest.mark.faults

# django-q2 runs its scheduler every 30 s of its guard loop, the first time 30 s after start.
SCHEDULER_WAIT_SECONDS = 75
# What django-q2 logs for each task its scheduler enqueues: the task's name and the schedule.
ENQUEUED = re.compile(r"created task (\S+) from schedule \[([^\]]+)\]")
MINUTE_SCHEDULES = {
    "ingress.inbox_pass",
    "ingress.raw_event_partitions",
    "outbox.dispatch_side_effects",
    "console.bulk_jobs_sweep",
    "ingress.signature_questions_github",
}


def store_pending_events(env, first: int, count: int) -> None:
    code = (
        "from tests.support.signing import store_signed_stripe_event, stripe_event\n"
        f"for n in range({first}, {first + count}):\n"
        "    store_signed_stripe_event(stripe_event(f'evt_redis_{n}', 'customer.created'))\n"
    )
    manage("shell", "-c", code, env=env, timeout=60)


def counts(url: str, sql: str) -> dict:
    with psycopg.connect(url, connect_timeout=10) as conn:
        return dict(conn.execute(sql).fetchall())


def test_schedules_fire_once_per_tick_across_two_clusters_and_a_lost_message_loses_no_work(
    tmp_path,
):
    with throwaway_cluster(prefix="edredis") as cluster, redis_server() as redis:
        url = cluster.createdb("eventdrop")
        env = app_env(url, Q_BROKER="redis", REDIS_URL=redis.url, Q_WORKERS="1")
        migrate(env)
        manage("ensure_schedules", env=env)
        store_pending_events(env, 0, 40)
        due = counts(url, "SELECT name, next_run <= now() FROM django_q_schedule")
        assert {name for name, is_due in due.items() if is_due} == MINUTE_SCHEDULES
        # One tick each: the next one an hour away, wherever the test's clock has got to.
        with psycopg.connect(url, connect_timeout=10) as conn:
            conn.execute(
                "UPDATE django_q_schedule SET minutes = 60 WHERE name = ANY(%s)",
                [sorted(MINUTE_SCHEDULES)],
            )

        clusters = [
            start_procfile("worker", env, log=tmp_path / f"qcluster-{n}.log") for n in (1, 2)
        ]
        try:
            deadline = time.monotonic() + SCHEDULER_WAIT_SECONDS
            while True:
                enqueued = [ENQUEUED.findall(c.output()) for c in clusters]
                ran = counts(url, 'SELECT name, "group" FROM django_q_task')
                logged = dict(enqueued[0] + enqueued[1])
                if set(logged.values()) >= MINUTE_SCHEDULES and set(logged) <= set(ran):
                    break  # every minute schedule enqueued, and every task enqueued has run
                assert all(c.alive for c in clusters), [c.output()[-2000:] for c in clusters]
                assert time.monotonic() < deadline, (
                    f"waited {SCHEDULER_WAIT_SECONDS} s for every minute schedule's task to be "
                    f"enqueued and run; enqueued {enqueued}, ran {ran}"
                )
                time.sleep(1)
        finally:
            for process in clusters:
                process.stop()
        logs = [process.output() for process in clusters]
        tasks = counts(url, 'SELECT "group", count(*) FROM django_q_task GROUP BY 1')
        assert tasks == dict.fromkeys(MINUTE_SCHEDULES, 1), (tasks, [log[-3000:] for log in logs])
        enqueued = [[schedule for _, schedule in ENQUEUED.findall(log)] for log in logs]
        assert sorted(enqueued[0] + enqueued[1]) == sorted(MINUTE_SCHEDULES), enqueued
        failed = counts(
            url, "SELECT name, count(*) FROM django_q_task WHERE NOT success GROUP BY 1"
        )
        assert failed == {}
        # Through Redis, the one inbox pass verified each pending event once.
        assert counts(
            url, "SELECT signature_status, count(*) FROM ingress_rawevent GROUP BY 1"
        ) == {"verified": 40}

        # A message lost in the broker: the rows it should have nudged wait, untouched.
        store_pending_events(env, 40, 5)
        manage(
            "shell",
            "-c",
            "from django_q.tasks import async_task; async_task('ingress.tasks.inbox_pass')",
            env=env,
        )
        queued = subprocess.run(
            ["redis-cli", "-p", str(redis.port), "LLEN", "django_q:eventdrop:q"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        assert queued == "1"
        subprocess.run(
            ["redis-cli", "-p", str(redis.port), "FLUSHALL"],
            timeout=10,
            check=True,
            capture_output=True,
        )
        assert counts(
            url, "SELECT signature_status, count(*) FROM ingress_rawevent GROUP BY 1"
        ) == {"verified": 40, "pending": 5}
        assert counts(url, "SELECT name, count(*) FROM django_q_schedule GROUP BY 1").keys() >= (
            MINUTE_SCHEDULES
        )
        manage("process_inbox", "--once", env=env, timeout=60)
        assert counts(
            url, "SELECT signature_status, count(*) FROM ingress_rawevent GROUP BY 1"
        ) == {"verified": 45}
