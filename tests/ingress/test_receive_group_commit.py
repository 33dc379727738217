"""Group commit (ingress/store.py): webhooks stored at the same moment share one INSERT and one
commit, each answered with its own row, and a row the database refuses fails only itself.

A second connection holds a SHARE lock on the raw store, so the first request's INSERT (the
leader's) waits on the database; three more requests queue behind it meanwhile. Released, the
leader commits its row alone and hands the lead to the oldest queued one, which writes all
three in one statement. Rows written by one INSERT share one transaction id (`xmin`).
"""

import threading
import time

import psycopg
import pytest
from django.db import DatabaseError, connection

from ingress.models import RawEvent
from ingress.services import raw_event_store
from ingress.sources import all_sources
from ingress.store import raw_rows

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_SECONDS = 10.0


def _store(body: bytes, headers: dict, outcomes: dict, key: str) -> None:
    try:
        event = raw_event_store(
            source=all_sources()["stripe"],
            method="POST",
            path="/webhooks/stripe/",
            query_string="",
            headers={"stripe-signature": "t=1,v1=00", **headers},
            body=body,
            remote_addr="127.0.0.1",
        )
        outcomes[key] = event.pk
    except DatabaseError as exc:
        outcomes[key] = exc
    finally:
        connection.close()


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def _lock_url() -> str:
    settings = connection.settings_dict
    return (
        f"postgresql://{settings['USER'] or 'postgres'}@{settings['HOST'] or '127.0.0.1'}:"
        f"{settings['PORT'] or 5432}/{settings['NAME']}"
    )


def _while_the_leader_waits(requests: list[tuple[str, bytes, dict]]) -> dict:
    """Start the first request as the leader, blocked in its INSERT; queue the others behind
    it; release; return each request's outcome (its row id, or the error it raised)."""
    outcomes: dict = {}
    with psycopg.connect(_lock_url(), autocommit=False) as lock:
        lock.execute("LOCK TABLE ingress_rawevent IN SHARE MODE")
        threads = []
        for number, (key, body, headers) in enumerate(requests):
            thread = threading.Thread(target=_store, args=(body, headers, outcomes, key))
            thread.start()
            threads.append(thread)
            if number == 0:  # the leader has taken its own row and is in the INSERT
                _until(lambda: raw_rows._writing and not raw_rows._queue, "the leader")
            else:
                _until(lambda n=number: len(raw_rows._queue) == n, f"{number} queued")
        lock.rollback()  # releases the lock
    for thread in threads:
        thread.join(WAIT_SECONDS)
    assert len(outcomes) == len(requests)
    return outcomes


def _stored() -> dict[int, tuple[bytes, int]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, body, xmin::text::bigint FROM ingress_rawevent")
        return {pk: (bytes(body), xmin) for pk, body, xmin in cursor.fetchall()}


def test_requests_waiting_together_share_one_insert_each_answered_with_its_own_row():
    bodies = {key: f'{{"id": "evt_{key}"}}'.encode() for key in "abcd"}

    outcomes = _while_the_leader_waits([(key, bodies[key], {}) for key in "abcd"])

    stored = _stored()
    assert {key: stored[outcomes[key]][0] for key in "abcd"} == bodies
    transactions = {key: stored[outcomes[key]][1] for key in "abcd"}
    assert transactions["b"] == transactions["c"] == transactions["d"] != transactions["a"]
    assert RawEvent.objects.count() == 4


def test_a_row_the_database_refuses_fails_alone_and_its_batch_is_stored():
    # jsonb cannot hold \u0000: PostgreSQL refuses that row, not the statement's others.
    refused = {"x-note": "nul \u0000 here"}
    requests = [
        ("leader", b'{"id": "evt_leader"}', {}),
        ("refused", b'{"id": "evt_refused"}', refused),
        ("c", b'{"id": "evt_c"}', {}),
        ("d", b'{"id": "evt_d"}', {}),
    ]

    outcomes = _while_the_leader_waits(requests)

    assert isinstance(outcomes["refused"], DatabaseError)
    stored = _stored()
    assert sorted(body for body, _ in stored.values()) == [
        b'{"id": "evt_c"}',
        b'{"id": "evt_d"}',
        b'{"id": "evt_leader"}',
    ]
    assert {stored[outcomes[key]][0] for key in ("leader", "c", "d")} == {
        body for key, body, _ in requests if key != "refused"
    }
