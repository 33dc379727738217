"""Flow 2, first half: everything after the ACK up to the deliveries — verify, deduplicate,
fan out — and the worker's pass (`inbox_run_once`) that also runs them (ingress/deliveries/).

`raw_events_verify_batch` claims due `pending` raw events in one statement (`WITH … FOR
UPDATE SKIP LOCKED … INSERT … ON CONFLICT … RETURNING`), so any number of worker processes on
any number of hosts can run side by side without double work. The claim stops at
INBOX_BATCH_SIZE rows or INBOX_BATCH_BYTES of bodies, whichever comes first (always at least
one row): a flood of large junk bodies costs the worker a bounded batch, not its memory. It
marks the rows it hands out — a RawEventClaim row each, a row of the one queue
(kernel/queue.py) — and commits, without waiting for the WAL flush: a claim lost with a
database crash only means no worker death is counted for it.

The batch is then settled in one transaction that first locks its rows, fenced on the claim:
each event is verified on its stored bytes, its verdict recorded, its dedup key settled (a
unique index decides the winner) and one Delivery row created per registered handler
(ingress.deliveries.deliveries_for_event); settling ends the claim. In the worker's pass the
deliveries that need no claim (every handler unordered, none paused) are run right there, in
that same transaction, and inserted `done` (ingress/deliveries/create.py, "run at settle").

One bad row never blocks the others. Should settling the batch raise for anything but our
database being unavailable, its savepoint is rolled back and the same locked rows are
settled one by one, each under a savepoint of its own in the same transaction. A row that
raises again is charged only if the failure can be about it (kernel/retry.py's
`classify`): a failure counted on the row and a not-before time, and after
INBOX_MAX_ROW_FAILURES it is rejected `processing_failed`. A database error is never
evidence about a row: the row waits, uncharged, its error recorded, backing off by how long
it has waited. Bodies holding text PostgreSQL cannot store are rejected `unstorable_text`
before any write.

A row whose settling kills the worker (a crash, the out-of-memory killer) is counted before
it can kill the next one — the rule, in docs/flows.md ("A row that kills its worker"):

- A worker that is alive settles every claim it makes or gives it back (no death counted):
  when our database fails under a batch, at once if the connection still works, else first
  thing on its next pass; SIGTERM lets the current pass finish. So a claim left unsettled is
  one whose worker died: once its holder stops beating, the claim is taken back with the
  death counted (`worker_deaths`, kernel/queue.py's rearm_orphaned).
- A row claimed again after a death is claimed alone (the claim stops before it, or takes
  it by itself), and settled without running handlers: a handler that kills is counted on
  its delivery (ingress/deliveries/), not on the event.
- A row found with INBOX_MAX_WORKER_DEATHS deaths is not settled again: it is rejected
  `worker_died`, visibly, and re-verifying it hands it back to the worker.

Retry, backoff and giving up are properties of the rows (processing_failures,
retry_not_before, signature_status, their claims), never control flow held in memory —
except the claims this process still owes a give-back (kept on its holder, kernel/queue.py).
"""

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import F
from django.db.models.expressions import DatabaseDefault
from django.utils import timezone
from opentelemetry.trace import Span

from ingress.deliveries import (
    DATABASE_UNAVAILABLE,
    SettleRunRaised,
    deliveries_for_event,
    deliveries_rearm_orphaned,
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
    RawEventClaim,
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
from ingress.signature_replays import signature_replays_settle
from ingress.sources import all_sources
from ingress.verifiers import StoredRequest, Verdict
from kernel import tracing
from kernel.db.json_rows import json_rows
from kernel.logformat import raised_at
from kernel.processing_region import processing_pass
from kernel.queue import (
    BEAT,
    CLAIMED_PREFIX,
    CLAIMS,
    FENCED,
    PENDING_VALUES,
    Claim,
    Holder,
    claims_json,
    group_branches,
    statement,
    this_process,
)
from kernel.retry import Action, RetryPolicy, RetryStrategy, classify

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
    claim are run here, in this transaction (ingress/deliveries/create.py, "run at settle").
    Returns how many deliveries it ran.
    """
    # One verify span per event, under its receive span; its deliveries start under it.
    spans = _verify_spans(events) if tracing.enabled() else {}
    verdicts = {event.id: _verdict_for(event) for event in events}
    # A body-only signature seen under another delivery id is a question for its provider:
    # such events are written `questioned` there and settled later by the answer, a replay
    # answered so is rejected (ingress/signature_replays.py); junk past its source's cap
    # keeps its row but not its payload (rejected_payloads.py).
    replays = signature_replays_settle(events, verdicts, now)
    verdicts |= replays.verdicts
    events = [event for event in events if event.id not in replays.questioned]
    if not events:
        _end_verify_spans(spans, {})
        return 0
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
        parents = {n: tracing.traceparent_of(span) for n, span in spans.items()}
        ran = _run_at_settle(events, runnable, now, parents)
        deliveries = [
            delivery
            for event, specs in routed
            if event.id not in ran
            for delivery in deliveries_for_event(event, specs, now)
        ]
        for delivery in deliveries:
            delivery.traceparent = parents.get(delivery.raw_event_id, "")
        _insert_all(deliveries)

    if not ran:  # else written with them, under their savepoint
        _save_settled(events)
    _end_verify_spans(spans, {event.id: event for event in events})
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


def _verify_spans(events: list[RawEvent]) -> dict[int, Span]:
    return {
        event.id: tracing.start_span(
            "webhook verify",
            parent=event.traceparent,
            attributes={"eventdrop.raw_event_id": event.id, "eventdrop.source": event.source},
        )
        for event in events
    }


def _end_verify_spans(spans: dict[int, Span], settled: dict[int, RawEvent]) -> None:
    """Each span with its event's outcome (a questioned event's is decided later)."""
    for event_id, span in spans.items():
        event = settled.get(event_id)
        if event is not None:
            span.set_attributes(
                {
                    "eventdrop.signature_status": event.signature_status,
                    "eventdrop.rejection_reason": event.rejection_reason,
                    "eventdrop.dispatch_status": event.dispatch_status,
                    "eventdrop.event_type": event.event_type,
                }
            )
        else:
            span.set_attribute("eventdrop.signature_status", SignatureStatus.QUESTIONED)
        span.end()


def _run_at_settle(
    events: list[RawEvent],
    runnable: list[tuple[RawEvent, list[HandlerSpec]]],
    now: datetime,
    parents: dict[int, str],
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
            handled_at = deliveries_run_at_settle(runnable, now, parents=parents)
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
    """Claim up to `limit` due pending raw events (and at most INBOX_BATCH_BYTES of bodies),
    settle them, commit. Returns how many were claimed.

    The batch is settled under a savepoint; should that raise, it is rolled back and the
    same locked rows are settled one by one (`_settle_one_by_one`), so a poison row costs
    its batch one slower pass instead of stalling it.
    """
    return _verify_batch(limit=limit, now=now, run_handlers=False)[0]


def _verify_and_run_batch(limit: int | None) -> tuple[int, int]:
    """raw_events_verify_batch that also runs the deliveries needing no claim (the worker's
    pass): (events settled, deliveries run). A batch that fails at COMMIT — a handler's write
    checked only then — is given back, claimed and settled again without running handlers,
    so its deliveries are run by the claim, which isolates the failing one; and handlers rest
    from running at settle for a while (ingress/deliveries/)."""
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


@dataclass(frozen=True)
class ClaimedBatch:
    """One batch of raw events claimed by this process: a queue claim each (kernel/queue.py),
    which fences everything written for it."""

    claims: tuple[Claim, ...]
    received: tuple[datetime, datetime]  # the oldest and newest received_at: partition pruning
    fence: str  # claims_json(claims): built once, for the lock and the end of the claim

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(claim.id for claim in self.claims)


# The inbox's claim, one statement, of the one queue's pieces (kernel/queue.py): the holder's
# beat; `groups`: the sources, each a share of the whole limit; `due`: per source up to
# `limit` pending rows, oldest first, locked (SKIP LOCKED: a live batch's rows are another
# worker's), not claimed now; the claimed prefix, within the bytes budget, a suspect (a
# worker died with it) alone; `m`: marked `processing`, a RawEventClaim row each (an upsert:
# a row claimed before has one). A claim another worker made meanwhile is left to it.
# octet_length of a stored bytea reads its length from the TOAST pointer, not the body.
_CLAIM = (
    "WITH beat AS (" + BEAT + "), {due}"  # noqa: S608 (constants)
    ", c AS (" + CLAIMED_PREFIX + "),"
    " m AS (INSERT INTO {claim} AS t (id, status, claimed_at, claimed_by, attempts, last_error)"
    " SELECT id, 'processing', %(now)s, %(holder)s, 1, '' FROM c"
    " ON CONFLICT (id) DO UPDATE SET status = 'processing', claimed_at = excluded.claimed_at,"
    " claimed_by = excluded.claimed_by, attempts = t.attempts + 1 WHERE t.status = 'pending'"
    " RETURNING t.id, t.attempts, t.worker_deaths)"
    " SELECT m.id, due.received_at, m.attempts, m.worker_deaths FROM m JOIN due ON due.id = m.id"
)
# One source's due rows (a branch of the claim's TURNS), in the pending index's order.
_SOURCE_DUE = (
    "SELECT r.id, r.received_at, coalesce(k.worker_deaths, 0) AS worker_deaths,"
    " octet_length(r.body) AS bytes, {name} AS fair_group FROM {raw} AS r"
    " LEFT JOIN {claim} AS k ON k.id = r.id WHERE r.signature_status = 'pending'"
    " AND r.source = {name}"
    " AND (r.retry_not_before IS NULL OR r.retry_not_before <= %(now)s)"
    " AND k.status IS DISTINCT FROM 'processing' AND r.body_encryption = ANY(%(keys)s)"
)


def _claim_statement(sources: Sequence[str], limit: int) -> str:
    """The claim for these sources (a branch each) and this limit, both literals: the text is
    the same for the same set, so it is prepared once, and its generic plan knows them."""
    due = group_branches(
        _SOURCE_DUE, names=sources, inner_order="r.received_at", alias="r", limit=limit
    )
    return _claim_sql(
        _CLAIM.replace("{due}", due),
        order="received_at, id",
        running_bytes="sum(bytes) OVER w",
    )


# The sources with pending rows that no setting names any more (a source removed while its
# events waited): a skip scan of the pending index, which on the partitioned store descends
# every partition, so it runs at most every SOURCE_SCAN_SECONDS, not with every claim.
_PENDING_SOURCES = (
    "WITH RECURSIVE "  # noqa: S608 (constants)
    + PENDING_VALUES.replace("{column}", "source")
    .replace("{table}", "{raw}")
    .replace("{pending}", "t.signature_status = 'pending'")
    + " SELECT name FROM names WHERE name IS NOT NULL"
)
SOURCE_SCAN_SECONDS = 60.0


def raw_events_claim_sources(*, holder: Holder | None = None) -> list[str]:
    """The sources a claim goes round: every configured one, and any other with pending rows
    (found by the last scan)."""
    memo = (holder or this_process()).memo
    clock = time.monotonic()
    due_at, found = memo.get("inbox.sources", (0.0, ()))
    if clock >= due_at:
        with connection.cursor() as cursor:
            cursor.execute(_claim_sql(_PENDING_SOURCES))
            found = tuple(name for (name,) in cursor.fetchall())
        memo["inbox.sources"] = (clock + SOURCE_SCAN_SECONDS, found)
    return sorted(set(all_sources()) | set(found))


# How often a claim first takes back the claims of the dead: a dead worker's rows wait its
# holder's TTL and at most this long (not with every claim: a transaction more per batch).
REARM_EVERY_SECONDS = 2.0


def raw_events_claim(
    *, limit: int, now: datetime, holder: Holder | None = None
) -> ClaimedBatch | None:
    """Claim a batch (see _CLAIM) in a transaction of its own, committed; None if nothing is
    due. First, every REARM_EVERY_SECONDS, the claims of the dead are due again
    (raw_event_claims_rearm_orphaned). The claim's mark must outlive a worker that dies
    settling the batch, so it cannot share the settling transaction; its commit does not wait
    for the WAL flush (`synchronous_commit = off` for this transaction only): a mark lost with
    a database crash counts no death."""
    holder = holder or this_process()
    sources = raw_events_claim_sources(holder=holder)
    if not sources:
        return None  # no source configured, none with pending rows
    last = holder.memo.get("inbox.rearmed_at")
    # Also when the clock went back (a step of the system clock, a test's own `now`).
    if last is None or not last <= now < last + timedelta(seconds=REARM_EVERY_SECONDS):
        raw_event_claims_rearm_orphaned(now=now)
        holder.memo["inbox.rearmed_at"] = now
    sql = _claim_statement(sources, limit)
    with transaction.atomic(), connection.cursor() as cursor:
        # One plan for the connection's life (the statement names its sources and its limit,
        # so a generic plan is the right one): planned per claim, a branch per source over
        # every day's partition would cost more than the claim itself.
        cursor.execute(
            "SELECT set_config('synchronous_commit', 'off', true),"
            " set_config('plan_cache_mode', 'force_generic_plan', true)"
        )
        cursor.execute(
            sql,
            {
                **holder.beat_params(now),
                # A body encrypted with a key we no longer hold stays pending, never charged
                # or rejected: our configuration, not the row's fault (it shows as pending age).
                "keys": sorted(keyring().known_ids),
                "limit": limit,
                "budget": settings.INBOX_BATCH_BYTES,
            },
        )
        rows = cursor.fetchall()
    holder.beaten_at = now
    if not rows:
        return None
    rows.sort(key=lambda row: (row[1], row[0]))
    claims = tuple(
        Claim(id=id, attempts=attempts, claimed_at=now, holder=holder.id, worker_deaths=deaths)
        for id, _, attempts, deaths in rows
    )
    return ClaimedBatch(
        claims=claims, received=(rows[0][1], rows[-1][1]), fence=claims_json(claims)
    )


def raw_event_claims_rearm_orphaned(*, now: datetime) -> int:
    """Claims whose holder is gone (its worker died, its region was lost) due again, the
    death counted unless the holder was another region's (kernel/queue.py);
    INBOX_CLAIM_LEASE_SECONDS is the backstop. Returns how many."""
    orphans = RawEventClaim.objects.rearm_orphaned(
        now=now, backstop_seconds=settings.INBOX_CLAIM_LEASE_SECONDS, max_deaths=None
    )
    if orphans:
        logger.warning(
            "ingress.verify.rearmed_orphaned",
            extra={"count": len(orphans), "taken_back": sum(o.taken_back for o in orphans)},
        )
    return len(orphans)


# The claim's rows still its own, locked with their claims for the settling transaction (the
# fence, kernel/queue.py's FENCED). The claim rows KEY SHARE: the re-arm's FOR UPDATE skips a
# live batch, while another worker's claim (an upsert, NO KEY UPDATE) passes them without
# waiting: waiting there, on rows it holds, it deadlocked with this lock. The received_at
# range as constants: the day partitions pruned when planning.
_LOCK_CLAIMED = (
    "SELECT r.* FROM " + CLAIMS + " JOIN {claim} AS t ON " + FENCED  # noqa: S608 (constants)
    + " JOIN {raw} AS r ON r.id = t.id"
    " WHERE r.received_at BETWEEN %(oldest)s AND %(newest)s"
    " AND r.signature_status = 'pending' ORDER BY r.received_at, r.id"
    " FOR UPDATE OF r FOR KEY SHARE OF t"
)


def _claim_sql(sql: str, **pieces: str) -> str:
    quote = connection.ops.quote_name
    return statement(
        sql,
        raw=quote(RawEvent._meta.db_table),
        claim=quote(RawEventClaim._meta.db_table),
        **pieces,
    )


def _verify_batch(
    *, limit: int | None, now: datetime | None, run_handlers: bool
) -> tuple[int, int]:
    raw_events_give_back_unreturned()
    now = now or timezone.now()
    claim = raw_events_claim(limit=limit or settings.INBOX_BATCH_SIZE, now=now)
    if claim is None:
        return 0, 0
    try:
        ran = _settle_claim(claim, now, run_handlers=run_handlers)
    except BaseException:
        # Not settled, and this worker lives: the claim is given back, so that it is never
        # taken for a worker that died with these rows (database errors included: they are
        # about us, not the rows).
        _give_back(claim)
        raise
    return len(claim.ids), ran


def _settle_claim(claim: ClaimedBatch, now: datetime, *, run_handlers: bool) -> int:
    """Lock the claim's rows (fenced on it), set aside those with too many worker deaths,
    settle the rest, end the claim, commit. Returns how many deliveries ran at settle."""
    with transaction.atomic():
        oldest, newest = claim.received
        events = list(
            RawEvent.objects.raw(
                _claim_sql(_LOCK_CLAIMED),
                {"oldest": oldest, "newest": newest, "claims": claim.fence},
            )
        )
        if len(events) < len(claim.ids):
            # Taken back and claimed by another worker (this one was frozen past the lease,
            # say): theirs now, and fenced out of everything written here.
            logger.warning(
                "ingress.verify.lost_claim", extra={"events": len(claim.ids) - len(events)}
            )
        locked = {event.id for event in events}
        deaths = {c.id: c.worker_deaths for c in claim.claims if c.id in locked}
        doomed = [e for e in events if deaths[e.id] >= settings.INBOX_MAX_WORKER_DEATHS]
        if doomed:
            _set_aside_worker_died(doomed, deaths, now)
            events = [event for event in events if event not in doomed]
        for event in events:
            if deaths[event.id]:
                # A suspect (alone in its batch): its handlers are left to its deliveries'
                # claim, so that a handler killing the worker is counted on its delivery.
                run_handlers = False
                logger.warning(
                    "ingress.verify.worker_death_counted",
                    extra={"raw_event_id": event.id, "deaths": deaths[event.id]},
                )
        ran = 0
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
                _settle_one_by_one([event.id for event in events], now)
        # Settled, set aside or waiting on a recorded failure: the claim is over either way
        # (the worker lived), in the transaction that says so.
        # Fenced: a claim not locked here is another worker's now, and stays.
        RawEventClaim.objects.forget(claim.claims, fence=claim.fence)
    return ran


RAW_EVENT_WORKER_DIED_ERROR = (
    "worker_died: its worker died {deaths} times in a row settling it (killed, out of memory, "
    "a crash); re-verify hands it back to the worker"
)


def _set_aside_worker_died(events: list[RawEvent], deaths: dict[int, int], now: datetime) -> None:
    """Reject the rows whose worker died INBOX_MAX_WORKER_DEATHS times settling them, in the
    claim's transaction; the error says how many deaths."""
    for event in events:
        RawEvent.objects.filter(id=event.id, received_at=event.received_at).update(
            signature_status=SignatureStatus.REJECTED,
            rejection_reason=RejectionReason.WORKER_DIED,
            dispatch_status=DispatchStatus.NOT_DISPATCHED,
            processing_error=RAW_EVENT_WORKER_DIED_ERROR.format(deaths=deaths[event.id])[:255],
            retry_not_before=None,
            verified_at=now,
            verify_count=F("verify_count") + 1,
        )
        logger.error(
            "ingress.verify.worker_died",
            extra={"raw_event_id": event.id, "source": event.source, "deaths": deaths[event.id]},
        )


def _give_back(claim: ClaimedBatch) -> None:
    given = RawEventClaim.objects.give_back_or_owe(claim.claims)
    if given:
        logger.warning("ingress.verify.claims_given_back", extra={"events": given})


def raw_events_give_back_unreturned() -> int:
    """Give back the claims this process owes (kernel/queue.py's Holder.pay). Returns how
    many rows. Raises while our database is unavailable (they stay owed)."""
    given = RawEventClaim.objects.pay_owed()
    if given:
        logger.warning("ingress.verify.claims_given_back", extra={"events": given})
    return given


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
            _record_settle_failure(event, exc, now)


def raw_event_retry_policy() -> RetryPolicy:
    """For raw events whose settling raises (see _record_settle_failure). Unjittered: one
    row's own retry, not a herd, and a fixed pause keeps a bad row out of the next pass."""
    return RetryPolicy(
        max_attempts=settings.INBOX_MAX_ROW_FAILURES,
        base_seconds=settings.INBOX_ROW_RETRY_BASE_SECONDS,
        cap_seconds=max(settings.INBOX_ROW_RETRY_BASE_SECONDS, 3600.0),
        jitter=False,
    )


def _record_settle_failure(event: RawEvent, exc: Exception, now: datetime) -> None:
    """Record a row's own failure to settle, as kernel/retry.py decides it: charged and due
    again after the backoff, rejected `processing_failed` after N or on a permanent error,
    or (a database error, never evidence about the row) released uncharged, backing off by
    how long it has waited since it arrived. Only the exception's class (and SQLSTATE) is
    kept: its message may quote the payload."""
    error = type(exc).__name__
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    if sqlstate:
        error += f" (SQLSTATE {sqlstate})"
    error = storable_text(SETTLE_FAILED.format(error=error))[:255]
    failure = classify(exc)
    failures = event.processing_failures + failure.charged
    decision = RetryStrategy(raw_event_retry_policy()).decide(
        failure, attempts=failures, now=now, waiting_since=event.received_at
    )
    row = RawEvent.objects.filter(id=event.id, received_at=event.received_at)
    if decision.action == Action.GIVE_UP:
        row.update(
            processing_error=error,
            processing_failures=failures,
            retry_not_before=None,
            signature_status=SignatureStatus.REJECTED,
            rejection_reason=RejectionReason.PROCESSING_FAILED,
            dispatch_status=DispatchStatus.NOT_DISPATCHED,
            verified_at=now,
            verify_count=F("verify_count") + 1,
        )
    else:
        row.update(
            processing_error=error,
            processing_failures=failures,
            retry_not_before=decision.retry_at,
        )
    logger.error(
        "ingress.verify.row_failed",
        extra={
            "raw_event_id": event.id,
            "source": event.source,
            "error": error,
            "where": raised_at(exc),
            "charged": decision.charged,
            "failures": failures,
            "set_aside": decision.action == Action.GIVE_UP,
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
    in the processing region, and fenced for the pass (kernel/processing_region.py)."""
    with processing_pass() as here:
        if not here:
            return InboxPass(verified=0, delivered=0, rearmed=0)
        rearmed = deliveries_rearm_orphaned()
        verified, ran = _verify_and_run_batch(limit)
        delivered = deliveries_run_due(limit=limit)
    return InboxPass(verified=verified, delivered=ran + delivered, rearmed=rearmed)
