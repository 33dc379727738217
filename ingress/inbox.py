"""Flow 2, first half: everything after the ACK up to the deliveries — verify, deduplicate,
fan out — and the worker's pass (`inbox_run_once`) that also runs them (ingress/deliveries.py).

`raw_events_verify_batch` claims due `pending` raw events with `SELECT … FOR UPDATE SKIP
LOCKED`, so any number of worker processes on any number of hosts can run side by side
without double work, and settles the whole batch in that one transaction: each event is
verified on its stored bytes, its verdict recorded, its dedup key settled (a unique index
decides the winner) and one Delivery row created per registered handler (built by
ingress.deliveries.deliveries_for_event). The batch is settled under one savepoint and
committed once — verdicts, dedup keys and deliveries together; a crash in between leaves
the events `pending` and they are simply claimed again. In the worker's pass the deliveries
that need no claim (every handler unordered, none paused) are run right there, in that same
transaction, and inserted `done` (ingress/deliveries.py, "run at settle").

One bad row never blocks the others. Should settling the batch raise for anything but our
database being unavailable, its savepoint is rolled back and the same locked rows are
settled one by one, each under a savepoint of its own in the same transaction, so only the
rows that raise again are charged: a failure counted on the row and a not-before time, and
after INBOX_MAX_ROW_FAILURES it is rejected `processing_failed`. Bodies holding text
PostgreSQL cannot store are rejected `unstorable_text` before any write.

Retry, backoff and giving up are properties of the rows (processing_failures,
retry_not_before, signature_status), never control flow held in memory.

A raw event whose settling kills the worker is not bounded yet: its claim is rolled back with
the dying connection, so nothing on the row counts the deaths, and the batch it belongs to is
claimed again (and dies again) every pass. Counting them would need a committed "claimed"
mark before settling — a second commit per batch on the fast path, which verification is
designed not to pay. Until then such a row shows as a worker in a crash loop with a growing
`raw_events_oldest_pending_age_seconds`, and no tool sets it aside yet (an open limit).
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import F, Q
from django.db.models.expressions import DatabaseDefault
from django.utils import timezone

from ingress.deliveries import (
    DATABASE_UNAVAILABLE,
    SettleRunRaised,
    deliveries_for_event,
    deliveries_rearm_stale,
    deliveries_run_at_settle,
    deliveries_run_due,
    deliveries_runnable_at_settle,
    deliveries_settle_run_rest,
)
from ingress.encryption import keyring
from ingress.handlers import HandlerSpec, handlers_for
from ingress.models import (
    DedupKey,
    DispatchStatus,
    RawEvent,
    RawEventOrigin,
    RejectionReason,
    SignatureStatus,
)
from ingress.payloads import (
    holds_unstorable_text,
    raw_event_body,
    raw_event_headers,
    storable_text,
)
from ingress.providers import dedup_key_for, verify
from ingress.reconcile.verdict import backfilled_verdict
from ingress.rejected_payloads import rejected_payloads_cap
from ingress.replays import signature_replay_verdicts
from ingress.sources import all_sources
from ingress.verifiers import StoredRequest, Verdict
from kernel.db.json_rows import json_rows
from kernel.logformat import raised_at
from kernel.processing import processing_pass
from kernel.retry import RetryPolicy

logger = logging.getLogger(__name__)

SETTLE_FAILED = "{error} in verify/dedup/dispatch"


# --- verify, dedup, fan out ----------------------------------------------------------------


def _verdict_for(event: RawEvent) -> Verdict:
    source = all_sources().get(event.source)
    if source is None:
        return Verdict(reason=RejectionReason.UNKNOWN_SOURCE)
    request = StoredRequest(
        headers=raw_event_headers(event), body=raw_event_body(event), received_at=event.received_at
    )
    if event.origin == RawEventOrigin.BACKFILLED:
        # Fetched by a reconciliation run from the provider's API, not received: there is
        # no signature to check, the fetch is the proof (ingress/reconcile/verdict.py).
        verdict = backfilled_verdict(source, request)
    else:
        verdict = verify(source, request)
    # Signed is not storable: an escaped NUL or lone surrogate in the event type or id would
    # fail our own UPDATE, and anywhere else every handler that stores it.
    if verdict.ok and holds_unstorable_text(request.headers, request.body):
        return Verdict(reason=RejectionReason.UNSTORABLE_TEXT)
    return verdict


def raw_events_settle(events: list[RawEvent], now: datetime, *, run_handlers: bool = False) -> int:
    """Verify, dedup and fan out a batch of events locked by the caller's transaction.

    raw_events_verify_batch calls it under the claim; raw_event_reverify (ingress/services.py)
    on the one row it locked. `run_handlers` (the worker's pass): the deliveries that need no
    claim are run here, in this transaction (ingress/deliveries.py, "run at settle").
    Returns how many deliveries it ran.
    """
    verdicts = {event.id: _verdict_for(event) for event in events}
    # A body-only signature seen under another delivery id is a replay (ingress/replays.py);
    # junk past its source's cap keeps its row but not its payload (rejected_payloads.py).
    verdicts |= signature_replay_verdicts(events, verdicts, now)
    rejected_payloads_cap(events, verdicts, now)
    accepted: list[RawEvent] = []
    ran: dict[int, int] = {}  # event id -> deliveries run at settle
    for event in events:
        verdict = verdicts[event.id]
        event.verify_count += 1
        event.verified_at = now
        event.event_type = verdict.event_type[:255]
        event.matched_secret_index = verdict.secret_index
        event.provider_retry_num = verdict.provider_retry_num
        event.provider_retry_reason = verdict.provider_retry_reason[:64]
        if verdict.ok:
            event.signature_status = SignatureStatus.VERIFIED
            event.rejection_reason = ""
            event.dedup_key = dedup_key_for(event, verdict)
            accepted.append(event)
        else:
            event.signature_status = SignatureStatus.REJECTED
            event.rejection_reason = verdict.reason
            event.dispatch_status = DispatchStatus.NOT_DISPATCHED

    if accepted:
        # Sorted so that two workers inserting overlapping keys lock them in the same order
        # (no deadlock). INSERT … ON CONFLICT DO NOTHING RETURNING names the keys this batch
        # won; only for the others (a provider redelivery of an event settled earlier, or a
        # key another worker holds) does a SELECT after it (a fresh snapshot under READ
        # COMMITTED, after any conflicting insert committed) tell who won.
        keys = sorted(
            {(event.source, event.dedup_key): event for event in reversed(accepted)}.items()
        )
        won = _insert_all(
            [DedupKey(source=s, key=k, raw_event_id=e.id, created_at=now) for (s, k), e in keys],
            returning=("source", "key"),
        )
        winners = {key: event.id for key, event in keys if key in won}
        taken = [key for key, _ in keys if key not in won]
        if taken:
            winners |= {
                (row.source, row.key): row.raw_event_id
                for row in DedupKey.objects.filter(
                    key__in=[key for _, key in taken], source__in={source for source, _ in taken}
                )
            }
        routed: list[tuple[RawEvent, list[HandlerSpec]]] = []
        for event in accepted:
            winner = winners.get((event.source, event.dedup_key))
            if winner is not None and winner != event.id:
                event.dispatch_status = DispatchStatus.DUPLICATE
                event.duplicate_of_id = winner
                continue
            specs = handlers_for(event.provider, event.event_type)
            event.dispatch_status = (
                DispatchStatus.DISPATCHED if specs else DispatchStatus.NO_HANDLER
            )
            routed.append((event, specs))
        runnable = deliveries_runnable_at_settle(routed) if run_handlers else []
        ran = _run_at_settle(events, runnable, now)
        _insert_all(
            [
                delivery
                for event, specs in routed
                if event.id not in ran
                for delivery in deliveries_for_event(event, specs, now)
            ]
        )

    if not ran:  # else written with them, under their savepoint
        _save_settled(events)
    logger.info(
        "ingress.verify.batch_settled",
        extra={
            "events": len(events),
            "verified": len(accepted),
            "rejected": len(events) - len(accepted),
            "duplicates": sum(e.dispatch_status == DispatchStatus.DUPLICATE for e in accepted),
            "delivered": sum(ran.values()),
        },
    )
    return sum(ran.values())


def _run_at_settle(
    events: list[RawEvent], runnable: list[tuple[RawEvent, list[HandlerSpec]]], now: datetime
) -> dict[int, int]:
    """Run the runnable events' handlers and write the whole batch's verdicts, those events
    stamped handled, under a savepoint; returns {event id: deliveries run}. Should a handler
    raise, the savepoint is rolled back and nothing is returned: the caller inserts every
    delivery `pending` and writes the verdicts, as without `run_handlers`.
    """
    if not runnable:
        return {}
    try:
        with transaction.atomic():
            handled_at = deliveries_run_at_settle(runnable, now)
            for event, _ in runnable:
                event.handled_at = handled_at
            _save_settled(events, handled=True)
    except SettleRunRaised as raised:
        cause = raised.__cause__
        if connection.needs_rollback or connection.connection is None:
            # The rollback to the savepoint failed too (Django closed the connection, or
            # marked the transaction for rollback): our database is gone, not a handler's
            # fault. Propagated as the claimed path does; the events stay `pending`.
            raise (cause or raised) from None
        for event, _ in runnable:
            event.handled_at = None
        logger.info(
            "ingress.verify.settle_run_rolled_back",
            extra={
                "events": len(runnable),
                "handler": str(raised),
                "error": type(cause).__name__ if cause else "",
            },
        )
        return {}
    return {event.id: len(specs) for event, specs in runnable}


# The columns raw_events_settle decides, written for the whole batch by one UPDATE … FROM
# json_to_recordset(…) (_save_settled).
_SETTLED_COLUMNS = (
    "signature_status",
    "rejection_reason",
    "verify_count",
    "verified_at",
    "event_type",
    "matched_secret_index",
    "provider_retry_num",
    "provider_retry_reason",
    "dedup_key",
    "duplicate_of_id",
    "dispatch_status",
)


def _save_settled(events: list[RawEvent], *, handled: bool = False) -> None:
    """One UPDATE for the batch's verdicts, each row found by (id, received_at).

    Not Model.bulk_update, whose CASE-per-column SQL costs more Python time than the
    verification itself, and not one UPDATE per row either (the server runs each as its own
    statement). The batch's received_at range, as constants, lets PostgreSQL prune to the
    batch's day partitions when it plans.
    """
    meta = RawEvent._meta
    by_column = {field.column: field for field in meta.concrete_fields}
    columns = (*_SETTLED_COLUMNS, "handled_at") if handled else _SETTLED_COLUMNS
    fields = [by_column[column] for column in ("id", "received_at", *columns)]
    values = [[getattr(event, field.attname) for event in events] for field in fields]
    (id_sql, id_params), (at_sql, at_params), *settled, rows = _row_set(fields, values)
    quote = connection.ops.quote_name
    assignments = ", ".join(
        f"{quote(field.column)} = {sql}"
        for field, (sql, _) in zip(fields[2:], settled, strict=True)
    )
    table = quote(meta.db_table)
    sql = (
        f"UPDATE {table} SET {assignments} FROM {rows[0]} "  # noqa: S608 (identifiers from the model)
        f"WHERE {table}.id = {id_sql} AND {table}.received_at = {at_sql} "
        f"AND {table}.received_at BETWEEN %s AND %s"
    )
    received = values[1]
    params = [p for _, ps in settled for p in ps] + rows[1] + id_params + at_params
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, min(received), max(received)])
        if cursor.rowcount != len(events):
            # Each row is locked by this transaction: a miss is a bug, never a race.
            raise RuntimeError(f"settled {cursor.rowcount} of {len(events)} raw events")


def _row_set(fields, values: list[list]) -> list[tuple[str, list]]:
    """A set of rows for one set-based statement: per field, its SQL expression and that
    expression's parameters, then the FROM item and its parameters.

    `values` holds one list per field, one value per row (the model's values; each field
    prepares its own for the database). A column whose rows all share one value is sent
    once, as a typed parameter: most of a batch's columns are the same for every row (now,
    statuses, defaults). The others travel as one JSON document that `json_to_recordset`
    turns into typed columns, rows in their order (kernel/db/json_rows.py): as arrays
    for `unnest()`, psycopg adapted them element by element in Python, a seventh of the
    inbox worker's CPU (docs/benchmarks.md, "The drain's handler and statements").
    """
    db = connections[DEFAULT_DB_ALIAS]  # not the proxy: it is asked once per value
    expressions: list[tuple[str, list]] = []
    varying: list[tuple[str, str]] = []  # (name, type) of each column sent per row
    columns: list[list] = []
    rows = len(values[0])
    for field, column in zip(fields, values, strict=True):
        db_type = field.cast_db_type(db)
        first = column[0]
        if all(value == first and type(value) is type(first) for value in column):
            expressions.append((f"%s::{db_type}", [field.get_db_prep_save(first, db)]))
        else:
            name = f"c{len(varying)}"
            varying.append((name, db_type))
            columns.append([field.get_db_prep_save(value, db) for value in column])
            expressions.append((f"v.{name}", []))
    if varying:
        names = [name for name, _ in varying]
        definitions = ", ".join(f"{name} {db_type}" for name, db_type in varying)
        document = json_rows(names, zip(*columns, strict=True))
        expressions.append((f"json_to_recordset(%s::json) AS v({definitions})", [document]))
    else:
        expressions.append(("generate_series(1, %s) AS v", [rows]))
    return expressions


def _insert_all(objs: list, *, returning: tuple[str, ...] = ()) -> set[tuple]:
    """INSERT unsaved instances of one model in one statement, ON CONFLICT DO NOTHING (as
    bulk_create(ignore_conflicts=True)); returns the `returning` columns of the rows it
    inserted (the conflicting ones are not returned).

    Every concrete column is written with the instance's value after the field's pre_save
    (defaults and auto_now exactly as bulk_create applies them), except the auto primary
    key and columns left to their database default.
    """
    if not objs:
        return set()
    meta = type(objs[0])._meta
    fields, values = [], []
    for field in meta.concrete_fields:
        if field.primary_key and getattr(objs[0], field.attname) is None:
            continue  # the sequence numbers it
        column = [field.pre_save(obj, True) for obj in objs]
        if isinstance(column[0], DatabaseDefault):
            continue  # the database's own default
        fields.append(field)
        values.append(column)
    *expressions, (rows_sql, rows_params) = _row_set(fields, values)
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608 (identifiers from the model)
        f"SELECT {', '.join(sql for sql, _ in expressions)} FROM {rows_sql} "
        "ON CONFLICT DO NOTHING"
    )
    if returning:
        sql += " RETURNING " + ", ".join(quote(meta.get_field(name).column) for name in returning)
    with connection.cursor() as cursor:
        cursor.execute(sql, [p for _, ps in expressions for p in ps] + rows_params)
        return {tuple(row) for row in cursor.fetchall()} if returning else set()


def raw_events_verify_batch(*, limit: int | None = None, now: datetime | None = None) -> int:
    """Claim up to `limit` due pending raw events, settle them, commit. Returns how many.

    The batch is settled under a savepoint; should that raise, it is rolled back and the
    same locked rows are settled one by one (`_settle_one_by_one`), so a poison row costs
    its batch one slower pass instead of stalling it.
    """
    return _verify_batch(limit=limit, now=now, run_handlers=False)[0]


def _verify_and_run_batch(limit: int | None) -> tuple[int, int]:
    """raw_events_verify_batch that also runs the deliveries needing no claim (the worker's
    pass): (events settled, deliveries run). A batch that fails at COMMIT — a handler's write
    checked only then — is claimed and settled again without running handlers, so its
    deliveries are run by the claim, which isolates the failing one; and handlers rest from
    running at settle for a while (ingress/deliveries.py)."""
    try:
        return _verify_batch(limit=limit, now=None, run_handlers=True)
    except DATABASE_UNAVAILABLE:
        raise
    except Exception as exc:
        logger.warning(
            "ingress.verify.settle_run_commit_failed", extra={"error": type(exc).__name__}
        )
        deliveries_settle_run_rest()
        return _verify_batch(limit=limit, now=None, run_handlers=False)


def _verify_batch(
    *, limit: int | None, now: datetime | None, run_handlers: bool
) -> tuple[int, int]:
    limit = limit or settings.INBOX_BATCH_SIZE
    now = now or timezone.now()
    ran = 0
    with transaction.atomic():
        events = list(
            RawEvent.objects.select_for_update(skip_locked=True)
            .filter(signature_status=SignatureStatus.PENDING)
            # A row that failed waits out its backoff: a filter on the pending-index scan.
            .filter(Q(retry_not_before__isnull=True) | Q(retry_not_before__lte=now))
            # A body encrypted with a key we no longer hold stays pending, never charged or
            # rejected: our configuration, not the row's fault (it shows as pending age).
            .filter(body_encryption__in=keyring().known_ids)
            .order_by("received_at")[:limit]
        )
        if events:
            try:
                with transaction.atomic():
                    ran = raw_events_settle(events, now, run_handlers=run_handlers)
            except DATABASE_UNAVAILABLE:
                raise
            except Exception as exc:
                logger.warning(
                    "ingress.verify.batch_failed",
                    extra={"events": len(events), "error": type(exc).__name__},
                )
                ran = 0
                _settle_one_by_one([event.id for event in events], now)
    return len(events), ran


def _settle_one_by_one(ids: list[int], now: datetime) -> None:
    """Settle each row under its own savepoint; charge the rows that raise (see below).

    The rows are read again: the failed batch left the objects half-updated in memory.
    They are still locked by this transaction, so nobody else has touched them.
    """
    for event in RawEvent.objects.filter(id__in=ids).order_by("received_at", "id"):
        try:
            with transaction.atomic():
                raw_events_settle([event], now)
        except DATABASE_UNAVAILABLE:
            raise
        except Exception as exc:
            _charge_settle_failure(event, exc, now)


def raw_event_retry_policy() -> RetryPolicy:
    """For raw events whose settling raises (see _charge_settle_failure)."""
    return RetryPolicy(
        max_attempts=settings.INBOX_MAX_ROW_FAILURES,
        base_seconds=settings.INBOX_ROW_RETRY_BASE_SECONDS,
        cap_seconds=max(settings.INBOX_ROW_RETRY_BASE_SECONDS, 3600.0),
    )


def _charge_settle_failure(event: RawEvent, exc: Exception, now: datetime) -> None:
    """Count one failure on the row: not before `now + backoff` again, set aside after N.

    The backoff is the policy's ceiling, without jitter: it is one row's own retry, not a
    herd to spread, and a fixed pause keeps a bad row from coming back the very next pass.
    Only the exception's class (and SQLSTATE) is kept: its message may quote the payload.
    """
    policy = raw_event_retry_policy()
    failures = event.processing_failures + 1
    error = type(exc).__name__
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    if sqlstate:
        error += f" (SQLSTATE {sqlstate})"
    error = storable_text(SETTLE_FAILED.format(error=error))[:255]
    row = RawEvent.objects.filter(id=event.id, received_at=event.received_at)
    if policy.gives_up_after(failures):
        row.update(
            processing_failures=failures,
            processing_error=error,
            retry_not_before=None,
            signature_status=SignatureStatus.REJECTED,
            rejection_reason=RejectionReason.PROCESSING_FAILED,
            dispatch_status=DispatchStatus.NOT_DISPATCHED,
            verified_at=now,
            verify_count=F("verify_count") + 1,
        )
    else:
        row.update(
            processing_failures=failures,
            processing_error=error,
            retry_not_before=now + timedelta(seconds=policy.ceiling(failures)),
        )
    logger.error(
        "ingress.verify.row_failed",
        extra={
            "raw_event_id": event.id,
            "source": event.source,
            "error": error,
            "where": raised_at(exc),
            "failures": failures,
            "set_aside": policy.gives_up_after(failures),
        },
    )


# --- the worker's pass: verify a batch, run a batch ---------------------------------------


@dataclass(frozen=True)
class InboxPass:
    verified: int
    delivered: int
    rearmed: int

    @property
    def idle(self) -> bool:
        return not (self.verified or self.delivered or self.rearmed)


def inbox_run_once(*, limit: int | None = None) -> InboxPass:
    """One pass of the worker: re-arm stale, verify a batch (running the deliveries that
    need no claim right there), run a batch of claimed deliveries. With several regions, only
    in the processing region, and fenced for the pass (kernel/processing.py)."""
    with processing_pass() as here:
        if not here:
            return InboxPass(verified=0, delivered=0, rearmed=0)
        rearmed = deliveries_rearm_stale()
        verified, ran = _verify_and_run_batch(limit)
        delivered = deliveries_run_due(limit=limit)
    return InboxPass(verified=verified, delivered=ran + delivered, rearmed=rearmed)
