"""Fair shares (issue 41): the inbox's claim goes round the sources and the deliveries' claim
round the handlers, oldest first within each, so a backlog on one costs the others at most
a share of a batch. In-process on PostgreSQL, with the real claims; the flood on real
processes is tests/ingress/test_fair_share_processes.py."""

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ingress.deliveries import deliveries_claim, deliveries_run_due
from ingress.handlers import unregister, webhook_handler
from ingress.inbox import raw_events_claim, raw_events_claim_sources, raw_events_verify_batch
from ingress.models import Delivery, RawEvent
from ingress.services import raw_event_store
from ingress.sources import all_sources
from kernel.queue import Holder
from tests.support.signing import github_headers

pytestmark = pytest.mark.django_db


def store(source: str, body: bytes, headers: dict[str, str]) -> RawEvent:
    return raw_event_store(
        source=all_sources()[source],
        method="POST",
        path=f"/webhooks/{source}/",
        query_string="",
        headers={"content-type": "application/json", **headers},
        body=body,
        remote_addr="127.0.0.1",
    )


def store_junk(count: int, *, size: int = 100) -> list[RawEvent]:
    """Bodies anyone can send to the Stripe endpoint: a made-up signature."""
    return [
        store("stripe", b"j" * size + str(n).encode(), {"stripe-signature": "t=1,v1=00"})
        for n in range(count)
    ]


def store_github(count: int, *, prefix: str = "g") -> list[RawEvent]:
    events = []
    for n in range(count):
        body = json.dumps({"zen": f"{prefix}-{n}"}).encode()
        headers = github_headers(body, event="ping", delivery=f"{prefix}-{n}")
        events.append(
            store("github", body, {key[5:].replace("_", "-").lower(): value
                                   for key, value in headers.items()})
        )
    return events


def test_the_inbox_claim_goes_round_the_sources_oldest_first_within_each(settings):
    junk = store_junk(30)
    genuine = store_github(3)  # behind the whole flood
    claim = raw_events_claim(limit=6, now=timezone.now())
    assert claim is not None
    # In turns: each source's oldest, then each source's second, ...
    assert sorted(claim.ids) == sorted([e.id for e in junk[:3]] + [e.id for e in genuine])


def test_a_source_backlog_costs_the_others_at_most_one_share_of_the_bytes(settings):
    junk = store_junk(20, size=10_000)
    genuine = store_github(2)
    body = len(bytes(junk[0].body))
    settings.INBOX_BATCH_BYTES = 3 * body  # three junk bodies a batch, at most
    claim = raw_events_claim(limit=500, now=timezone.now())
    assert claim is not None
    assert set(e.id for e in genuine) <= set(claim.ids)
    assert len(set(claim.ids) & {e.id for e in junk}) <= 3


def test_the_first_batch_after_a_flood_verifies_the_other_source(settings):
    store_junk(50)
    genuine = store_github(1)
    settings.INBOX_BATCH_SIZE = 10
    assert raw_events_verify_batch() == 10
    genuine[0].refresh_from_db()
    assert genuine[0].signature_status == "verified"


def test_a_source_no_setting_names_is_claimed_after_the_scan(settings):
    (orphan,) = store_junk(1)
    RawEvent.objects.filter(id=orphan.id).update(source="gone")
    holder = Holder.new()
    assert "gone" in raw_events_claim_sources(holder=holder)
    claim = raw_events_claim(limit=10, now=timezone.now(), holder=holder)
    assert claim is not None and orphan.id in claim.ids


# --- deliveries -------------------------------------------------------------------------------


@pytest.fixture
def two_handlers():
    calls: list[tuple[str, int]] = []

    def busy(event, payload):
        calls.append(("busy", event.id))

    def quiet(event, payload):
        calls.append(("quiet", event.id))

    for func in (busy, quiet):
        webhook_handler(provider="github", event_types=[f"test.{func.__name__}"])(func)
    names = {func.__name__: f"{func.__module__}.{func.__qualname__}" for func in (busy, quiet)}
    yield names, calls
    for name in names.values():
        unregister(name)


def pending_deliveries(handler: str, count: int, *, due) -> list[Delivery]:
    events = store_github(count, prefix=handler.rsplit(".", 1)[-1] + str(due.timestamp()))
    RawEvent.objects.filter(id__in=[e.id for e in events]).update(signature_status="verified")
    return Delivery.objects.bulk_create(
        Delivery(raw_event_id=event.id, handler=handler, next_attempt_at=due) for event in events
    )


def test_the_delivery_claim_goes_round_the_handlers(two_handlers):
    names, _ = two_handlers
    now = timezone.now()
    busy = pending_deliveries(names["busy"], 40, due=now - timedelta(minutes=5))  # a replay
    quiet = pending_deliveries(names["quiet"], 2, due=now)
    claims = deliveries_claim(limit=6, now=now)
    assert {claim.id for claim in claims} == {d.id for d in busy[:4]} | {d.id for d in quiet}


def test_a_bulk_replay_of_one_handler_delays_another_by_one_batch_at_most(two_handlers):
    names, calls = two_handlers
    now = timezone.now()
    pending_deliveries(names["busy"], 60, due=now - timedelta(minutes=1))
    quiet = pending_deliveries(names["quiet"], 1, due=now)
    assert deliveries_run_due(limit=10, now=now) == 10
    assert ("quiet", quiet[0].raw_event_id) in calls


def test_the_claim_reads_each_handler_on_its_pending_index(two_handlers):
    """The skip scan and each handler's scan use delivery_due_handler, not a sort of every
    pending delivery."""
    names, _ = two_handlers
    pending_deliveries(names["busy"], 5, due=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN SELECT id FROM ingress_delivery WHERE status = 'pending' AND handler = %s"
            " AND next_attempt_at <= now() ORDER BY next_attempt_at LIMIT 5",
            [names["busy"]],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "delivery_due_handler" in plan
