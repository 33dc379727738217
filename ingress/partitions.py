"""Daily partitions of the raw event store, and its retention.

`ingress_rawevent` is partitioned by range on `received_at` (migration 0001),
one partition per UTC day named `ingress_rawevent_pYYYYMMDD` covering `[day, day + 1)`, plus
the DEFAULT partition `ingress_rawevent_default`, which exists so that an INSERT never fails
because this maintenance lagged. `raw_event_partitions_maintain` (hourly, django-q2, and
`manage.py raw_event_partitions`) does, in this order:

1. create the partitions from yesterday through today + RAW_EVENT_PARTITIONS_AHEAD_DAYS, and
   one for every day whose rows sit in the DEFAULT partition, moving those rows in;
2. delete rejected events older than RAW_EVENT_REJECTED_RETENTION_DAYS (forensics only);
3. drop the partitions whose whole day is older than RAW_EVENT_RETENTION_DAYS, unless one of
   their events is still in flight: not yet verified (`signature_status='pending'`), waiting
   on a signature question (`questioned`) or with a delivery that has not finished
   (`pending`/`processing`). Such a partition is kept and
   retried on the next run.
   With RAW_EVENT_ARCHIVE_ENABLED, a partition is first archived to object storage and read
   back (ingress/archive.py); it is dropped only once that archive is verified, and kept
   when the upload or the check fails (the command then exits non-zero). A partition that
   holds events restored from an archive is kept RAW_EVENT_RESTORED_RETENTION_DAYS after
   their restore, and they are not archived again.

Deleting or dropping an event deletes its dedup key, its signature question, its deliveries
and their attempts first:
they point at raw events without a database foreign key (see ingress/models.py), so nothing
else would.

Every step is its own short transaction: the locks that ATTACH and DROP need are held for
milliseconds, not for the whole run. Each step first takes a transaction-level advisory lock
with `pg_try_advisory_xact_lock`, so a second run (another host, an overlapping schedule)
stops instead of racing, and re-reads the catalog under that lock, so it never repeats work
the other run did. Identifiers and partition bounds are formatted here from `date` objects;
no input reaches the SQL text.
"""

import logging
import re
import time as monotonic_time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.db.models import Q, QuerySet
from django.utils import timezone

from ingress import archive
from ingress.models import (
    DedupKey,
    Delivery,
    DeliveryAttempt,
    DeliveryStatus,
    RawEvent,
    RawEventClaim,
    RawEventOrigin,
    SignatureQuestion,
)
from ingress.models import SignatureStatus as Status

logger = logging.getLogger(__name__)

PARENT_TABLE = RawEvent._meta.db_table
DEFAULT_PARTITION = f"{PARENT_TABLE}_default"
_PARTITION_NAME = re.compile(rf"^{PARENT_TABLE}_p(\d{{4}})(\d{{2}})(\d{{2}})$")

# Any fixed 64-bit number works; it only has to differ from other advisory lock users of
# this database. Transaction-level, so a crashed run can never leave it held.
MAINTENANCE_LOCK_KEY = 0x696E_6772_6573_7370  # b"ingressp"
# ATTACH and DROP wait for conflicting locks, and while they wait every new query that needs
# the same table queues behind them, webhook INSERTs included. Give up quickly instead and
# leave the step to the next run.
_LOCK_TIMEOUT = "1s"
_LOCK_NOT_AVAILABLE = "55P03"
# Each run deletes rejected events that crossed their retention line within this window.
# Looking further back would scan every partition between the rejected and the full
# retention every hour; rows that slipped past the window (maintenance stopped for longer)
# still go with their partition at the full retention.
REJECTED_SWEEP_WINDOW = timedelta(days=2)

# Equalities rather than `status IN (...)`: each matches the predicate of one partial
# index (delivery_due_handler, delivery_processing, delivery_held), so the planner can read only
# unfinished rows. A held delivery (its handler paused) is unfinished: its event is kept.
_UNFINISHED_DELIVERY = (
    Q(status=DeliveryStatus.PENDING)
    | Q(status=DeliveryStatus.PROCESSING)
    | Q(status=DeliveryStatus.HELD)
)


@dataclass
class PartitionMaintenance:
    """What one run did (or, with dry_run, would do)."""

    dry_run: bool = False
    # Another run held the maintenance lock; this one stopped where it was.
    lock_busy: bool = False
    created: list[str] = field(default_factory=list)
    # Partition name -> rows moved into it from the DEFAULT partition.
    moved_from_default: dict[str, int] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    # Past retention but kept: some event in it is still in flight.
    kept_in_flight: list[str] = field(default_factory=list)
    # Steps that gave up on a lock timeout; the next run retries them.
    deferred: list[str] = field(default_factory=list)
    # Archive before drop: partition -> events archived and verified, and partition -> why
    # its archive failed (kept); kept for recently restored events; kept because rows changed
    # while the archive was written (the next run archives again).
    archived: dict[str, int] = field(default_factory=dict)
    archive_failed: dict[str, str] = field(default_factory=dict)
    kept_restored: list[str] = field(default_factory=list)
    kept_changed: list[str] = field(default_factory=list)
    # Dry run with the archive on: each drop would first archive and verify.
    archive_before_drop: bool = False
    rejected_deleted: int = 0

    def lines(self) -> list[str]:
        would = "would " if self.dry_run else ""
        out: list[str] = []
        if self.lock_busy:
            out.append("another maintenance run holds the lock; stopped (it does the work)")
        if not (self.created or self.lock_busy):
            out.append(f"{would}create no partition: all exist")
        for name in self.created:
            moved = self.moved_from_default.get(name, 0)
            suffix = f", {would}move {moved} rows from the default partition" if moved else ""
            out.append(f"{would}create {name}{suffix}")
        for name, events in self.archived.items():
            out.append(f"archived {name}: {events} events, verified")
        archive_first = "archive, verify and " if self.archive_before_drop else ""
        out.extend(f"{would}{archive_first}drop {name}" for name in self.dropped)
        out.extend(f"keep {name}: events still in flight" for name in self.kept_in_flight)
        for name, reason in self.archive_failed.items():
            out.append(f"keep {name}: ARCHIVE FAILED, not dropped ({reason})")
        out.extend(f"keep {name}: holds recently restored events" for name in self.kept_restored)
        out.extend(
            f"keep {name}: rows changed while archiving, next run archives again"
            for name in self.kept_changed
        )
        kept = self.kept_in_flight or self.archive_failed or self.kept_restored or self.kept_changed
        if not (self.dropped or kept or self.lock_busy):
            out.append("no partition past retention")
        out.extend(f"deferred {step}: lock timeout, next run retries" for step in self.deferred)
        out.append(f"{would}delete {self.rejected_deleted} rejected events past their retention")
        return out


class _LockHeld(Exception):
    """Another maintenance run holds the advisory lock."""


def partition_name(day: date) -> str:
    return f"{PARENT_TABLE}_p{day:%Y%m%d}"


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def _day_events(day: date) -> QuerySet[RawEvent]:
    # A range on the partition key: PostgreSQL prunes the scan to that day's partition.
    return RawEvent.objects.filter(
        received_at__gte=_day_start(day), received_at__lt=_day_start(day + timedelta(days=1))
    )


def _with_unfinished_delivery() -> QuerySet:
    return Delivery.objects.filter(_UNFINISHED_DELIVERY).values("raw_event_id")


def _has_in_flight(events: QuerySet[RawEvent]) -> bool:
    # Not yet verified, waiting on a question, or with an unfinished delivery: apart, since
    # ORed in one query they force a scan of the whole day; apart, each is an index lookup.
    return (
        events.filter(signature_status=Status.PENDING).exists()
        or events.filter(signature_status=Status.QUESTIONED).exists()
        or events.filter(id__in=_with_unfinished_delivery()).exists()
    )


def _delete_dependents(events: QuerySet[RawEvent]) -> None:
    """Delete the dedup keys, signature questions, deliveries and attempts of `events`, and
    any claim of theirs (only pending events have one, and their partitions are kept); they
    would dangle.

    Plain DELETEs with the events as a subquery rather than QuerySet.delete(): to cascade
    from deliveries to attempts, Django's collector would load every delivery of a whole day
    into memory, for attempts that the first statement deletes anyway.
    """
    ids_sql, params = events.values("id").query.sql_with_params()
    qn = connection.ops.quote_name
    attempt, delivery, dedup, claim, question = (
        qn(DeliveryAttempt._meta.db_table),
        qn(Delivery._meta.db_table),
        qn(DedupKey._meta.db_table),
        qn(RawEventClaim._meta.db_table),
        qn(SignatureQuestion._meta.db_table),
    )
    # Table names come from model metadata and the subquery from the ORM: no input here.
    statements = [
        f"DELETE FROM {attempt} WHERE delivery_id IN "  # noqa: S608
        f"(SELECT id FROM {delivery} WHERE raw_event_id IN ({ids_sql}))",
        f"DELETE FROM {delivery} WHERE raw_event_id IN ({ids_sql})",  # noqa: S608
        f"DELETE FROM {dedup} WHERE raw_event_id IN ({ids_sql})",  # noqa: S608
        f"DELETE FROM {claim} WHERE id IN ({ids_sql})",  # noqa: S608
        f"DELETE FROM {question} WHERE raw_event_id IN ({ids_sql})",  # noqa: S608
    ]
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement, params)


def _delete_events(events: QuerySet[RawEvent]) -> int:
    _delete_dependents(events)
    # Every relation into RawEvent is DO_NOTHING, so this is one DELETE, no collector.
    deleted, _ = events.delete()
    return deleted


def _rejected_expired(now: datetime) -> QuerySet[RawEvent]:
    days = settings.RAW_EVENT_REJECTED_RETENTION_DAYS
    cutoff = now - timedelta(days=days)
    return RawEvent.objects.filter(
        signature_status=Status.REJECTED,
        received_at__gte=cutoff - REJECTED_SWEEP_WINDOW,
        received_at__lt=cutoff,
    ).exclude(id__in=_with_unfinished_delivery())


def _expiry_boundary(now: datetime, retention_days: int) -> datetime:
    """Events before this instant are past retention: a whole UTC day, like a partition."""
    return _day_start((now - timedelta(days=retention_days)).astimezone(UTC).date())


def _defer_on_lock_timeout(exc: OperationalError, result: PartitionMaintenance, step: str) -> None:
    """Record `step` as deferred if it failed on lock_timeout; re-raise anything else."""
    if getattr(exc.__cause__, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
        raise exc
    logger.warning("ingress.partitions.lock_timeout", extra={"step": step})
    result.deferred.append(step)


@contextmanager
def _locked_step() -> Iterator[CursorWrapper]:
    """One short transaction holding the maintenance lock, or _LockHeld."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [MAINTENANCE_LOCK_KEY])
        if not cursor.fetchone()[0]:
            raise _LockHeld
        cursor.execute(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
        yield cursor


def _attached_partitions(cursor: CursorWrapper) -> dict[date, str]:
    """The daily partitions attached now, by day (other partitions, DEFAULT too, ignored)."""
    cursor.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass(%s)",
        [PARENT_TABLE],
    )
    days: dict[date, str] = {}
    for (name,) in cursor.fetchall():
        if match := _PARTITION_NAME.match(name):
            year, month, day = (int(part) for part in match.groups())
            days[date(year, month, day)] = name
    return days


def _default_rows_by_day(cursor: CursorWrapper) -> dict[date, int]:
    # Normally empty, so this scan costs nothing; rows here mean maintenance lagged.
    cursor.execute(
        "SELECT (received_at AT TIME ZONE 'UTC')::date, count(*) "  # noqa: S608
        f"FROM ONLY {connection.ops.quote_name(DEFAULT_PARTITION)} GROUP BY 1"
    )
    return dict(cursor.fetchall())


def _bound(day: date) -> str:
    return f"'{day:%Y-%m-%d} 00:00:00+00'"


def _create_partition(day: date) -> int | None:
    """Create and attach the partition of `day`, moving its rows out of the DEFAULT partition.

    PostgreSQL refuses a new partition for a range the DEFAULT partition holds rows in, so
    the table is created standalone, filled from the default, and only then attached. That is
    also the cheaper way when the default is empty: CREATE TABLE ... PARTITION OF takes an
    ACCESS EXCLUSIVE lock on the parent, which would block webhook INSERTs, while ATTACH only
    takes SHARE UPDATE EXCLUSIVE on it (plus ACCESS EXCLUSIVE on the default partition, which
    INSERTs routed to a daily partition never touch).

    Returns the rows moved, or None when another run created the partition meanwhile.
    """
    qn = connection.ops.quote_name
    parent, default, name = qn(PARENT_TABLE), qn(DEFAULT_PARTITION), qn(partition_name(day))
    with _locked_step() as cursor:
        if day in _attached_partitions(cursor):
            return None
        # Parent before default, the order ATTACH itself locks them in. The default is locked
        # up front so no INSERT for this day lands in it between the move and the ATTACH
        # (which would then fail), and so ATTACH does not have to upgrade a weaker lock.
        cursor.execute(f"LOCK TABLE ONLY {parent} IN SHARE UPDATE EXCLUSIVE MODE")
        cursor.execute(f"LOCK TABLE {default} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(
            f"CREATE TABLE {name} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        cursor.execute(
            f"WITH moved AS (DELETE FROM ONLY {default} "  # noqa: S608
            "WHERE received_at >= %s AND received_at < %s RETURNING *) "
            f"INSERT INTO {name} SELECT * FROM moved",
            [_day_start(day), _day_start(day + timedelta(days=1))],
        )
        moved = cursor.rowcount
        # ATTACH builds the parent's indexes on the new partition.
        cursor.execute(
            f"ALTER TABLE {parent} ATTACH PARTITION {name} "
            f"FOR VALUES FROM ({_bound(day)}) TO ({_bound(day + timedelta(days=1))})"
        )
    return moved


_DROPPED, _IN_FLIGHT, _RESTORED, _CHANGED = "dropped", "in_flight", "restored", "changed"


def _holds_recent_restores(events: QuerySet[RawEvent], now: datetime) -> bool:
    kept_since = now - timedelta(days=settings.RAW_EVENT_RESTORED_RETENTION_DAYS)
    return events.filter(origin=RawEventOrigin.RESTORED, restored_at__gte=kept_since).exists()


def _drop_partition(day: date, name: str, *, now: datetime, archived: dict[str, int]) -> str:
    """Drop the partition of `day` unless an event in it is in flight (or recently restored);
    with the archive on, only after the day's archive is written and verified. Returns an
    outcome (_DROPPED, ...); raises archive.ArchiveFailed with the partition untouched.

    The archive comes first, before anything is deleted, so a failed one leaves the day
    whole. Then the archived rows are counted again (behind the advisory lock, not under the
    parent's table lock, which would hold webhook INSERTs for a scan of the day): a row that
    arrived for the day meanwhile keeps the partition for the next run's fresh archive. A
    body rewritten by key rotation meanwhile is archived under its old key, which the
    archive's manifest lists and which must be kept while the archive is (docs/archive.md).

    Two steps. First, holding no table lock, check and delete the dependents (the slow part,
    proportional to the day's volume). Then lock the parent, which DROP needs in ACCESS
    EXCLUSIVE mode anyway, check again, delete what was added in between (normally nothing)
    and drop. Holding the parent lock *before* the second check is what makes it final: a
    replay or re-verification that read an event of this day has to commit (and its delivery
    is seen) before the lock is granted, and one that starts later waits and then finds
    nothing. Webhook INSERTs wait for that second step only, a few milliseconds.
    """
    events = _day_events(day)
    if _has_in_flight(events):
        return _IN_FLIGHT
    if _holds_recent_restores(events, now):
        return _RESTORED
    archived_count = None
    if archive.archive_enabled():
        archived_count = archived[name] = archive.archive_day(day, partition=name).events
    with _locked_step():
        if _has_in_flight(events):
            return _IN_FLIGHT
        if archived_count is not None and archive.archived_events(day).count() != archived_count:
            return _CHANGED
        _delete_dependents(events)
    with _locked_step() as cursor:
        cursor.execute(
            f"LOCK TABLE ONLY {connection.ops.quote_name(PARENT_TABLE)} IN ACCESS EXCLUSIVE MODE"
        )
        if _attached_partitions(cursor).get(day) != name:
            return _DROPPED  # another run dropped it meanwhile
        if _has_in_flight(events):
            return _IN_FLIGHT
        _delete_dependents(events)
        cursor.execute(f"DROP TABLE {connection.ops.quote_name(name)}")
    return _DROPPED


def raw_event_partitions_maintain(
    *,
    now: datetime | None = None,
    days_ahead: int | None = None,
    retention_days: int | None = None,
    dry_run: bool = False,
) -> PartitionMaintenance:
    """Create partitions ahead, empty the DEFAULT partition, apply retention (module doc)."""
    now = now or timezone.now()
    if days_ahead is None:
        days_ahead = settings.RAW_EVENT_PARTITIONS_AHEAD_DAYS
    if retention_days is None:
        retention_days = settings.RAW_EVENT_RETENTION_DAYS
    boundary = _expiry_boundary(now, retention_days)

    if dry_run:
        result = _plan_partitions(now=now, days_ahead=days_ahead, boundary=boundary)
    else:
        result = PartitionMaintenance()
        try:
            _maintain_partitions(result, now=now, days_ahead=days_ahead, boundary=boundary)
        except _LockHeld:
            result.lock_busy = True
    logger.info(
        "ingress.partitions.maintained",
        extra={
            "dry_run": dry_run,
            "lock_busy": result.lock_busy,
            "partitions_created": len(result.created),
            "rows_moved_from_default": sum(result.moved_from_default.values()),
            "partitions_dropped": len(result.dropped),
            "partitions_kept_in_flight": len(result.kept_in_flight),
            "steps_deferred": len(result.deferred),
            "rejected_deleted": result.rejected_deleted,
        },
    )
    return result


def _days_to_create(
    cursor: CursorWrapper, *, now: datetime, days_ahead: int
) -> tuple[list[date], dict[date, int], dict[date, str]]:
    today = now.astimezone(UTC).date()
    wanted = {today + timedelta(days=offset) for offset in range(-1, days_ahead + 1)}
    in_default = _default_rows_by_day(cursor)
    attached = _attached_partitions(cursor)
    return sorted((wanted | set(in_default)) - set(attached)), in_default, attached


def _expired_days(attached: dict[date, str], boundary: datetime) -> list[date]:
    return sorted(day for day in attached if _day_start(day + timedelta(days=1)) <= boundary)


def _maintain_partitions(
    result: PartitionMaintenance, *, now: datetime, days_ahead: int, boundary: datetime
) -> None:
    started = monotonic_time.monotonic()
    with connection.cursor() as cursor:
        missing, _, _ = _days_to_create(cursor, now=now, days_ahead=days_ahead)
    for day in missing:
        try:
            moved = _create_partition(day)
        except OperationalError as exc:
            _defer_on_lock_timeout(exc, result, f"create {partition_name(day)}")
            continue
        if moved is not None:
            result.created.append(partition_name(day))
            if moved:
                result.moved_from_default[partition_name(day)] = moved

    try:
        with _locked_step():
            result.rejected_deleted = _delete_events(_rejected_expired(now))
    except OperationalError as exc:
        # A row lock held by a re-verification, say: lock_timeout covers those too.
        _defer_on_lock_timeout(exc, result, "delete rejected events")

    with connection.cursor() as cursor:
        attached = _attached_partitions(cursor)
    budget = float(settings.RAW_EVENT_PARTITIONS_BUDGET_SECONDS)
    for day in _expired_days(attached, boundary):
        name = attached[day]
        if archive.archive_enabled():
            # Start an archive only while its worst case fits what is left of the run.
            worst = archive.day_worst_case_seconds(archive.day_sources(day))
            if monotonic_time.monotonic() - started + worst > budget:
                result.deferred.append(f"archive {name}: {worst:.0f} s worst case left no room")
                break
        try:
            outcome = _drop_partition(day, name, now=now, archived=result.archived)
        except OperationalError as exc:
            _defer_on_lock_timeout(exc, result, f"drop {name}")
            break  # every drop needs the same parent lock: the others would time out too
        except archive.ArchiveFailed as exc:
            logger.error(
                "ingress.partitions.archive_failed",
                extra={"partition": name, "error": str(exc)},
            )
            result.archive_failed[name] = str(exc)
            continue
        {
            _DROPPED: result.dropped,
            _IN_FLIGHT: result.kept_in_flight,
            _RESTORED: result.kept_restored,
            _CHANGED: result.kept_changed,
        }[outcome].append(name)


def _plan_partitions(*, now: datetime, days_ahead: int, boundary: datetime) -> PartitionMaintenance:
    result = PartitionMaintenance(dry_run=True)
    with connection.cursor() as cursor:
        missing, in_default, attached = _days_to_create(cursor, now=now, days_ahead=days_ahead)
    for day in missing:
        result.created.append(partition_name(day))
        if in_default.get(day):
            result.moved_from_default[partition_name(day)] = in_default[day]
    result.rejected_deleted = _rejected_expired(now).count()
    for day in _expired_days(attached, boundary):
        events = _day_events(day)
        if _has_in_flight(events):
            result.kept_in_flight.append(attached[day])
        elif _holds_recent_restores(events, now):
            result.kept_restored.append(attached[day])
        else:
            result.dropped.append(attached[day])
    result.archive_before_drop = archive.archive_enabled()
    return result
