"""Partition maintenance and retention of the raw event store (ingress/partitions.py).

The tests run real DDL against the real partitioned table, so they use
`transactional_db` and a fixture that drops every daily partition before and after each test
(TRUNCATE empties partitions but does not remove them). Time is injected through `now`.
"""

from datetime import UTC, date, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils.module_loading import import_string

from ingress.models import (
    DedupKey,
    Delivery,
    DeliveryAttempt,
    RawEvent,
    RawEventClaim,
    SignatureQuestion,
)
from ingress.partitions import (
    DEFAULT_PARTITION,
    MAINTENANCE_LOCK_KEY,
    PARENT_TABLE,
    partition_name,
    raw_event_partitions_maintain,
)
from kernel.schedules import SCHEDULES

NOW = datetime(2026, 6, 15, 10, 30, tzinfo=UTC)
TODAY = NOW.date()
OLD = NOW - timedelta(days=100)  # past the 90-day retention


def day(offset: int) -> date:
    return TODAY + timedelta(days=offset)


def make_event(received_at: datetime, status: str = "verified", **fields) -> RawEvent:
    values = {
        "source": "stripe",
        "provider": "stripe",
        "method": "POST",
        "path": "/webhooks/stripe/",
        "headers": {"stripe-signature": "t=1,v1=00"},
        "body": b'{"id": "evt_1"}',
        "body_sha256": "0" * 64,
        "rejection_reason": "bad_signature" if status == "rejected" else "",
    }
    return RawEvent.objects.create(
        received_at=received_at, signature_status=status, **{**values, **fields}
    )


def with_dependents(event: RawEvent, delivery_status: str = "done") -> Delivery:
    DedupKey.objects.create(source=event.source, key=f"evt_{event.pk}", raw_event=event)
    delivery = Delivery.objects.create(
        raw_event=event,
        handler="tests.handler",
        status=delivery_status,
        claimed_at=NOW if delivery_status == "processing" else None,
    )
    DeliveryAttempt.objects.create(
        delivery=delivery, number=1, started_at=NOW, finished_at=NOW, outcome="done"
    )
    return delivery


def dependents_of(event: RawEvent) -> tuple[int, int, int]:
    return (
        DedupKey.objects.filter(raw_event_id=event.pk).count(),
        Delivery.objects.filter(raw_event_id=event.pk).count(),
        DeliveryAttempt.objects.filter(delivery__raw_event_id=event.pk).count(),
    )


def attached() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass",
            [PARENT_TABLE],
        )
        return {name for (name,) in cursor.fetchall()}


def partition_bound(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = %s", [name]
        )
        return cursor.fetchone()[0]


def rows_in_default() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM ONLY {DEFAULT_PARTITION}")  # noqa: S608
        return cursor.fetchone()[0]


def table_of(event: RawEvent) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {PARENT_TABLE} WHERE id = %s",  # noqa: S608
            [event.pk],
        )
        return cursor.fetchone()[0]


def _drop_daily_partitions() -> None:
    with connection.cursor() as cursor:
        for name in attached() - {DEFAULT_PARTITION}:
            cursor.execute(f"DROP TABLE {connection.ops.quote_name(name)}")


@pytest.fixture
def pg(transactional_db):
    _drop_daily_partitions()
    yield
    _drop_daily_partitions()


@pytest.fixture
def other_session(transactional_db):
    """A second, independent database session (another host's maintenance, a worker)."""
    raw = connection.get_new_connection(connection.get_connection_params())
    raw.autocommit = False
    yield raw
    raw.rollback()
    raw.close()


# --- relations: what a dropped partition must take with it --------------------------------


def test_every_table_pointing_at_raw_events_is_cleaned_up_by_retention():
    """A tripwire: a new model pointing at RawEvent must be added to _delete_dependents."""

    def pointing_at(model):
        fields = model._meta.get_fields(include_hidden=True)  # DedupKey's relation is hidden
        return {f.related_model for f in fields if f.auto_created and not f.concrete}

    into_raw, into_delivery = pointing_at(RawEvent), pointing_at(Delivery)
    # RawEvent: duplicate_of; SignatureQuestion: its event and the one it repeats.
    assert into_raw == {RawEvent, DedupKey, Delivery, RawEventClaim, SignatureQuestion}
    # Delivery: superseded_by (no constraint; an id left dangling by retention is history)
    assert into_delivery == {DeliveryAttempt, Delivery}


def test_maintenance_is_scheduled_hourly():
    entry = next(e for e in SCHEDULES if e.name == "ingress.raw_event_partitions")
    assert import_string(entry.func) is raw_event_partitions_maintain
    assert (entry.schedule_type, entry.minutes) == ("I", 60)


# --- partitions ----------------------------------------------------------------------------


def test_creates_daily_partitions_from_yesterday_through_days_ahead(pg):
    result = raw_event_partitions_maintain(now=NOW, days_ahead=3)

    expected = [partition_name(day(offset)) for offset in range(-1, 4)]
    assert not result.lock_busy
    assert result.created == expected
    assert attached() == {DEFAULT_PARTITION, *expected}
    assert partition_bound(partition_name(TODAY)) == (
        "FOR VALUES FROM ('2026-06-15 00:00:00+00') TO ('2026-06-16 00:00:00+00')"
    )
    # New rows land in their day's partition, not in the default.
    event = make_event(NOW)
    assert table_of(event) == "ingress_rawevent_p20260615"


def test_second_run_is_idempotent(pg):
    raw_event_partitions_maintain(now=NOW, days_ahead=2)
    before = attached()

    again = raw_event_partitions_maintain(now=NOW, days_ahead=2)

    assert attached() == before
    assert again.created == [] and again.dropped == [] and again.moved_from_default == {}
    assert "create no partition: all exist" in again.lines()


def test_rows_in_the_default_partition_move_to_their_new_partition(pg):
    # Maintenance never ran: every INSERT so far landed in the DEFAULT partition.
    body = bytes(range(256))
    today_events = [make_event(NOW - timedelta(hours=hour), body=body) for hour in range(3)]
    late = make_event(NOW + timedelta(days=40))  # a skewed clock: outside the window
    assert rows_in_default() == 4

    result = raw_event_partitions_maintain(now=NOW, days_ahead=1)

    assert rows_in_default() == 0
    assert result.moved_from_default == {
        partition_name(TODAY): 3,
        partition_name(day(40)): 1,
    }
    assert partition_name(day(40)) in result.created
    assert {table_of(e) for e in today_events} == {partition_name(TODAY)}
    assert table_of(late) == partition_name(day(40))
    for event in today_events:  # moved byte-exact, same id
        moved = RawEvent.objects.get(pk=event.pk)
        assert bytes(moved.body) == body and moved.received_at == event.received_at
    # The identity sequence still hands out fresh ids after the move.
    assert make_event(NOW).pk > max(e.pk for e in [*today_events, late])


def test_drops_partitions_past_retention_with_their_dependents(pg):
    raw_event_partitions_maintain(now=OLD, days_ahead=0)  # the partitions of 100 days ago
    old = make_event(OLD)
    with_dependents(old)
    recent = make_event(NOW - timedelta(days=89))
    with_dependents(recent)

    result = raw_event_partitions_maintain(now=NOW, days_ahead=0)

    old_partitions = [partition_name(OLD.date() - timedelta(days=1)), partition_name(OLD.date())]
    assert result.dropped == old_partitions
    assert not set(old_partitions) & attached()
    assert not RawEvent.objects.filter(pk=old.pk).exists()
    assert dependents_of(old) == (0, 0, 0)
    assert dependents_of(recent) == (1, 1, 1)
    assert RawEvent.objects.filter(pk=recent.pk).exists()


def test_keeps_a_partition_that_holds_an_unverified_event(pg):
    raw_event_partitions_maintain(now=OLD, days_ahead=0)
    pending = make_event(OLD, status="pending")
    done = make_event(OLD)
    with_dependents(done)

    result = raw_event_partitions_maintain(now=NOW, days_ahead=0)

    assert result.kept_in_flight == [partition_name(OLD.date())]
    assert partition_name(OLD.date()) in attached()
    assert RawEvent.objects.filter(pk__in=[pending.pk, done.pk]).count() == 2
    assert dependents_of(done) == (1, 1, 1)
    assert f"keep {partition_name(OLD.date())}: events still in flight" in result.lines()


def test_expiry_is_by_whole_days(pg):
    # 90 days before NOW is 2026-03-17 10:30: that whole day stays, the day before goes.
    boundary = datetime(2026, 3, 17, tzinfo=UTC)
    raw_event_partitions_maintain(now=boundary, days_ahead=0)
    kept = make_event(boundary)
    gone = make_event(boundary - timedelta(microseconds=1))

    result = raw_event_partitions_maintain(now=NOW, days_ahead=0)

    assert result.dropped == [partition_name(date(2026, 3, 16))]
    assert list(RawEvent.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not RawEvent.objects.filter(pk=gone.pk).exists()


@pytest.mark.parametrize("delivery_status", ["pending", "processing"])
def test_keeps_a_partition_whose_event_has_an_unfinished_delivery(pg, delivery_status):
    raw_event_partitions_maintain(now=OLD, days_ahead=0)
    event = make_event(OLD)
    delivery = with_dependents(event, delivery_status=delivery_status)

    kept = raw_event_partitions_maintain(now=NOW, days_ahead=0)

    assert kept.kept_in_flight == [partition_name(OLD.date())]
    assert dependents_of(event) == (1, 1, 1)

    # Once the delivery finishes, the next run lets the day go.
    Delivery.objects.filter(pk=delivery.pk).update(status="dead")
    dropped = raw_event_partitions_maintain(now=NOW, days_ahead=0)
    assert partition_name(OLD.date()) in dropped.dropped
    assert dependents_of(event) == (0, 0, 0)


def test_rejected_events_have_a_shorter_retention(pg, settings):
    settings.RAW_EVENT_REJECTED_RETENTION_DAYS = 30
    expired = make_event(NOW - timedelta(days=31), status="rejected")
    DedupKey.objects.create(source="stripe", key="rejected", raw_event=expired)
    young = make_event(NOW - timedelta(days=29), status="rejected")
    verified = make_event(NOW - timedelta(days=31))
    with_delivery = make_event(NOW - timedelta(days=31), status="rejected")
    with_dependents(with_delivery, delivery_status="pending")

    result = raw_event_partitions_maintain(now=NOW, days_ahead=0)

    assert result.rejected_deleted == 1
    assert not RawEvent.objects.filter(pk=expired.pk).exists()
    assert not DedupKey.objects.filter(raw_event_id=expired.pk).exists()
    remaining = set(RawEvent.objects.values_list("pk", flat=True))
    assert {young.pk, verified.pk, with_delivery.pk} <= remaining


def test_dry_run_reports_and_changes_nothing(pg):
    raw_event_partitions_maintain(now=OLD, days_ahead=0)
    make_event(OLD)
    make_event(NOW)  # into the default partition: today has no partition yet
    before = attached()

    result = raw_event_partitions_maintain(now=NOW, days_ahead=0, dry_run=True)

    assert attached() == before and rows_in_default() == 1
    assert result.dry_run
    assert result.created == [partition_name(day(-1)), partition_name(TODAY)]
    assert result.moved_from_default == {partition_name(TODAY): 1}
    assert partition_name(OLD.date()) in result.dropped
    assert (
        f"would create {partition_name(TODAY)}, would move 1 rows from the default partition"
        in result.lines()
    )


def test_a_second_run_that_finds_the_lock_held_stops(pg, other_session):
    with other_session.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [MAINTENANCE_LOCK_KEY])

    result = raw_event_partitions_maintain(now=NOW, days_ahead=1)

    assert result.lock_busy and result.created == []
    assert attached() == {DEFAULT_PARTITION}

    other_session.rollback()  # the other run finished
    assert raw_event_partitions_maintain(now=NOW, days_ahead=1).created


def test_a_drop_that_waits_for_a_lock_gives_up_and_is_retried(pg, other_session):
    raw_event_partitions_maintain(now=OLD, days_ahead=0)
    raw_event_partitions_maintain(now=NOW, days_ahead=0, retention_days=365)
    old = make_event(OLD)
    # A long transaction that has read the parent: DROP needs it to end first. Waiting
    # would queue every webhook INSERT behind the DROP, so the step gives up instead.
    with other_session.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {PARENT_TABLE}")  # noqa: S608

    result = raw_event_partitions_maintain(now=NOW, days_ahead=0)

    first_old = partition_name(OLD.date() - timedelta(days=1))
    assert result.deferred == [f"drop {first_old}"]
    assert result.dropped == []
    assert {first_old, partition_name(OLD.date())} <= attached()

    other_session.rollback()
    retried = raw_event_partitions_maintain(now=NOW, days_ahead=0)
    assert partition_name(OLD.date()) in retried.dropped
    assert not RawEvent.objects.filter(pk=old.pk).exists()


def test_command_prints_what_it_would_do_and_then_does_it(pg):
    today = partition_name(datetime.now(tz=UTC).date())

    dry = StringIO()
    call_command("raw_event_partitions", "--dry-run", stdout=dry)
    assert f"would create {today}" in dry.getvalue()
    assert today not in attached()

    out = StringIO()
    call_command("raw_event_partitions", stdout=out)
    assert f"create {today}" in out.getvalue().splitlines()
    assert today in attached()
