"""Flow 2, second half: run the deliveries the inbox created, one per (event, handler).

`deliveries_run_due` claims due `pending` deliveries in one statement (`WITH … FOR UPDATE SKIP
LOCKED … UPDATE … RETURNING`: marked `processing`, attempt charged), then runs the batch in one
transaction: a handler's writes and its delivery's `done` commit together, and the batch pays
for one commit instead of one per event. That transaction first locks its claimed rows,
fenced on the claim (status, claimed_at, attempts): a row re-armed and claimed by another
worker meanwhile is not run, and a row this batch holds is never re-armed under it, however
long the batch takes — so each handler's effect happens once. No savepoint per handler
unless one raises: then the batch is rolled back and run again a savepoint each, so a
failing handler rolls back only its own savepoint (`_run_claimed`). A failure is recorded
on the row (`_record_failure`) as kernel/retry.py decides — the project's one finality
rule: a handler's permanent domain error kills it at once; a failure that may be its own is
charged and kills it only after DELIVERY_MAX_ATTEMPTS charged attempts AND
DELIVERY_TRANSIENT_HORIZON_SECONDS; our own database failing (a statement or lock timeout, a
deadlock, a restart) is never charged, and the delivery waits.

A worker that lives on records an outcome for every delivery it claimed, or gives the claim
back (`processing` to `pending`, the attempt given back) when our database fails under its
batch: at once if the connection still works, else first thing on its next pass. So a
delivery left `processing` and unlocked past DELIVERY_STALE_AFTER_SECONDS belongs to a
worker that died (killed, out of memory, a crash): `deliveries_rearm_stale` re-arms it with
the attempt given back — a death charges no attempt — and counts the death
(`worker_deaths`). A delivery with deaths is claimed alone; one whose worker died
INBOX_MAX_WORKER_DEATHS times in a row with it is `dead` (`worker_died`), never an endless
loop. The rule, and why a database restart or a deploy is never counted: docs/flows.md
("A row that kills its worker").

`deliveries_for_event` builds the rows the inbox inserts when it settles an event
(ingress/inbox.py), so what a new delivery starts as is decided here, next to how it runs.
Replay and re-arm by an operator are in ingress/services.py.
"""

import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Exists, F, OuterRef, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from ingress.encryption import keyring
from ingress.handlers import (
    HandlerSpec,
    PermanentHandlerError,
    get_handler,
    handler_note,
    handlers_for,
)
from ingress.models import (
    UNFINISHED_DELIVERY_STATUSES,
    Delivery,
    DeliveryAttempt,
    DeliveryStatus,
    HandlerPause,
    RawEvent,
)
from ingress.payloads import parse_payload, raw_event_body, raw_event_headers, storable_text
from kernel.db.json_rows import json_rows
from kernel.retry import (
    Action,
    Disposition,
    Failure,
    RetryPolicy,
    RetryStrategy,
    classify,
    fenced,
)

logger = logging.getLogger(__name__)

HANDLER_MISSING = "handler {name} is no longer registered"

# Our own database failing (connection lost, restart, statement or lock timeout, deadlock):
# not the row's fault, so never charged to one. The batch rolls back whole and the worker
# loop backs off; the rows are claimed again once the database answers.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)


def delivery_retry_policy() -> RetryPolicy:
    return RetryPolicy(
        max_attempts=settings.DELIVERY_MAX_ATTEMPTS,
        base_seconds=settings.DELIVERY_BACKOFF_BASE_SECONDS,
        cap_seconds=settings.DELIVERY_BACKOFF_CAP_SECONDS,
    )


def delivery_retry_strategy() -> RetryStrategy:
    """The project's one retry decision (kernel/retry.py), with the delivery settings."""
    return RetryStrategy(
        policy=delivery_retry_policy(),
        horizon_seconds=settings.DELIVERY_TRANSIENT_HORIZON_SECONDS,
    )


def deliveries_for_event(
    event: RawEvent, specs: list[HandlerSpec], now: datetime
) -> list[Delivery]:
    """The new (unsaved) deliveries of a settled event, one per handler, due now.

    An ordered handler's carries the event's ordering key and event time, read from the
    payload (parsed once per event, and only when some handler orders): the claim below
    keeps each key's deliveries one at a time and in order.
    """
    ordering: dict[str, tuple[str, datetime | None]] = {}
    if any(spec.ordered for spec in specs):
        try:
            payload = parse_payload(raw_event_headers(event), raw_event_body(event))
        except Exception:
            # Unreadable: delivered unordered, and its handler says why (a permanent error).
            payload = None
        ordering = {spec.name: spec.ordering_of(payload) for spec in specs if spec.ordered}
    paused: set[str] = set()
    if any(key for key, _ in ordering.values()):
        # An ordered delivery a pause covers is created `held`: created pending behind its
        # key's held head it would wait unseen (the claim only looks at a key's head), not
        # shown or counted as held. One read of the (few) active pauses, for ordered events
        # only; an unordered one is held by the claim when due.
        pauses = HandlerPause.objects.filter(resumed_at__isnull=True)
        paused = {
            spec.name
            for handler, source in pauses.values_list("handler", "source")
            for spec in specs
            if spec.name == handler or source == event.source
        }
    deliveries = []
    for spec in specs:
        key, event_time = ordering.get(spec.name, ("", None))
        deliveries.append(
            Delivery(
                raw_event_id=event.id,
                handler=spec.name,
                status=DeliveryStatus.HELD
                if key and spec.name in paused
                else DeliveryStatus.PENDING,
                next_attempt_at=now,
                ordering_key=key,
                event_time=(event_time or event.received_at) if key else None,
            )
        )
    return deliveries


# --- run at settle: a fresh event's deliveries in the transaction that settled it --------
#
# The worker's pass (ingress/inbox.py, inbox_run_once) runs a freshly verified event's
# handlers in the very transaction that verified it, when nothing needs the claim below: its
# handlers are all unordered (an ordered one waits for its key's turn), none is paused, and
# none raised at settle lately. Its deliveries are then inserted `done`, one `done` attempt
# each, and the event stamped handled in the same verdict UPDATE — instead of inserted
# `pending`, claimed (`processing`), the event read back, run, marked `done` and stamped
# handled in three more transactions. Exactly once holds as it does for a claimed batch: the
# handlers' writes, the deliveries, their attempts and the verdicts commit together or not
# at all (a crash leaves the events `pending`, claimed again).
#
# Should a handler raise, the run is rolled back to its savepoint (nothing of it stays) and
# the events' deliveries are inserted `pending` as usual: the claim runs them, and charges,
# retries or gives up a failing one exactly as before (its first run at settle was never an
# attempt). That handler is then left to the claim for _SETTLE_RUN_COOLDOWN_SECONDS, so a
# handler failing for every event does not run twice per event. A batch that fails at COMMIT
# (a handler's write checked only then, PostgreSQL's deferred foreign keys) is settled again
# without running handlers (ingress/inbox.py), and settle runs rest for that long.

_SETTLE_RUN_COOLDOWN_SECONDS = 60.0


@dataclass
class _SettleRunCooldown:
    handlers: dict[str, float] = field(default_factory=dict)  # handler -> monotonic deadline
    everything_until: float = 0.0


# Per worker process; only a cost decision (run now, or let the claim run it), never a verdict.
_settle_cooldown = _SettleRunCooldown()


def deliveries_settle_run_rest() -> None:
    """No handler runs at settle in this process for a while (a settle batch failed at COMMIT)."""
    _settle_cooldown.everything_until = time.monotonic() + _SETTLE_RUN_COOLDOWN_SECONDS


def deliveries_runnable_at_settle(
    routed: list[tuple[RawEvent, list[HandlerSpec]]],
) -> list[tuple[RawEvent, list[HandlerSpec]]]:
    """The (event, handlers) among freshly settled ones whose handlers may run at settle
    (see above). One read of the active pauses, only if any event qualifies otherwise."""
    clock = time.monotonic()
    if clock < _settle_cooldown.everything_until:
        return []
    cooled = {name for name, until in _settle_cooldown.handlers.items() if clock < until}
    candidates = [
        (event, specs)
        for event, specs in routed
        if specs and not any(spec.ordered or spec.name in cooled for spec in specs)
    ]
    if not candidates:
        return []
    pauses = list(
        HandlerPause.objects.filter(resumed_at__isnull=True).values_list("handler", "source")
    )
    if not pauses:
        return candidates
    handlers = {handler for handler, _ in pauses if handler}
    sources = {source for _, source in pauses if source}
    return [
        (event, specs)
        for event, specs in candidates
        if event.source not in sources and not any(spec.name in handlers for spec in specs)
    ]


class SettleRunRaised(Exception):
    """A handler raised while run at settle: the caller rolls the run back to its savepoint
    and inserts the deliveries `pending` instead."""


def deliveries_run_at_settle(
    runnable: list[tuple[RawEvent, list[HandlerSpec]]], now: datetime
) -> datetime:
    """Run these events' handlers in the caller's transaction and savepoint, and insert their
    deliveries `done` with one `done` attempt each. Returns when they finished (the events'
    handled_at, which the caller's verdict UPDATE writes). Raises SettleRunRaised (its cause
    the handler's exception) once a handler raises; the caller rolls back the savepoint.
    """
    # event id, handler, started, finished, the handler's note
    runs: list[tuple[int, str, datetime, datetime, str]] = []
    clock = timezone.now()  # one reading between two handlers: the one's end, the next's start
    for event, specs in runnable:
        payload = None
        for spec in specs:
            started = clock
            try:
                if payload is None:
                    payload = parse_payload(raw_event_headers(event), raw_event_body(event))
                note = handler_note(spec.func(event, payload))
            except Exception as exc:
                _settle_cooldown.handlers[spec.name] = (
                    time.monotonic() + _SETTLE_RUN_COOLDOWN_SECONDS
                )
                raise SettleRunRaised(spec.name) from exc
            clock = timezone.now()
            runs.append((event.id, spec.name, started, clock, note))
    finished = runs[-1][3]
    table = connection.ops.quote_name(Delivery._meta.db_table)
    attempt_table = connection.ops.quote_name(DeliveryAttempt._meta.db_table)
    started_at = runs[0][2]
    with connection.cursor() as cursor:
        # One statement for both tables: the deliveries (every column named: a test checks
        # the list against the model), finished when the run did, as a claimed batch's are,
        # and their attempts, each with its handler's own start and finish.
        cursor.execute(
            _SETTLE_RUN_INSERT.format(delivery=table, attempt=attempt_table),
            [
                json_rows(("raw_event_id", "handler", "started_at", "finished_at", "note"), runs),
                DeliveryStatus.DONE,
                now,
                started_at,
                now,
                finished,
                DeliveryAttempt.Outcome.DONE,
            ],
        )
        if cursor.rowcount != len(runs):
            # A delivery of a pending event already existed (a conflict): not ours to finish.
            raise SettleRunRaised(f"inserted {cursor.rowcount} of {len(runs)} deliveries")
    return finished


_SETTLE_RUN_INSERT = (
    "WITH r AS (SELECT * FROM json_to_recordset(%s::json) AS r(raw_event_id bigint,"
    " handler text, started_at timestamptz, finished_at timestamptz, note text)),"
    " d AS (INSERT INTO {delivery} (raw_event_id, handler, status, attempts, total_attempts,"
    "  next_attempt_at, claimed_at, last_error, first_failed_at, waiting_since, created_at,"
    "  finished_at, ordering_key, event_time, superseded_by_id, forced, worker_deaths)"
    "  SELECT r.raw_event_id, r.handler, %s, 1, 1, %s, %s, '', NULL, NULL, %s, %s, '', NULL,"
    "  NULL, false, 0 FROM r ON CONFLICT DO NOTHING RETURNING id, raw_event_id, handler)"
    " INSERT INTO {attempt} (delivery_id, number, started_at, finished_at, outcome, error, note)"
    " SELECT d.id, 1, r.started_at, r.finished_at, %s, '', r.note FROM d"
    " JOIN r ON r.raw_event_id = d.raw_event_id AND r.handler = d.handler"
)


# --- operator re-arms, holds and releases (called by ingress/services.py) ------------------


def _in_scope(rows, *, handler: str, source: str):
    """A pause's deliveries: one handler's, or every handler's for one source's events."""
    if handler:
        return rows.filter(handler=handler)
    return rows.filter(Exists(RawEvent.objects.filter(id=OuterRef("raw_event_id"), source=source)))


def deliveries_hold(*, handler: str = "", source: str = "") -> int:
    """Pending deliveries in a new pause's scope become `held` (the claim holds any that
    turn pending later). Returns how many. Inside the caller's transaction."""
    return _in_scope(
        Delivery.objects.filter(status=DeliveryStatus.PENDING), handler=handler, source=source
    ).update(status=DeliveryStatus.HELD)


def deliveries_release(
    *, handler: str = "", source: str = "", now: datetime, per_second: float
) -> int:
    """Held deliveries in a pause's scope back to `pending`, due one after another in
    received order (raw event id, the order of the store's INSERTs), `per_second` of them
    per second: the claim takes due deliveries oldest first, so the backlog runs in that
    order at that rate beside the live traffic. One UPDATE. Returns how many."""
    scoped = _in_scope(
        Delivery.objects.filter(status=DeliveryStatus.HELD), handler=handler, source=source
    )
    rows = list(scoped.order_by("raw_event_id", "id").values_list("id", "raw_event_id", "handler"))
    # What another active pause still covers stays held (and counted as held): released
    # now, it would only be held again when due, and show as pending meanwhile.
    still_paused = _paused_among(rows, besides=(handler, source))
    ids = [delivery_id for delivery_id, _, _ in rows if delivery_id not in still_paused]
    if not ids:
        return 0
    table = connection.ops.quote_name(Delivery._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS d SET status = %s, "  # noqa: S608 (constant identifiers)
            "next_attempt_at = %s + (r.n - 1) * (interval '1 second' / %s) "
            "FROM unnest(%s::bigint[]) WITH ORDINALITY AS r(id, n) "
            "WHERE d.id = r.id AND d.status = %s",
            [DeliveryStatus.PENDING, now, float(per_second), ids, DeliveryStatus.HELD],
        )
        return cursor.rowcount


# A delivery armed afresh (a replay, a re-arm of a dead one): no claim, no finish, fresh
# attempts, and neither its horizon nor an uncharged wait started.
_ARMED_AFRESH = {
    "attempts": 0,
    "worker_deaths": 0,
    "claimed_at": None,
    "finished_at": None,
    "first_failed_at": None,
    "waiting_since": None,
}

# What a replay arms again. `pending` is re-armed too (attempts reset, due now): a replay is
# the operator's "try it now", and it stays one row, so a second replay queues nothing twice.
# `processing` is left to finish on its own, `held` to its pause; `superseded` is re-armed
# only by force, and then runs despite the newer event of its key.
_REPLAY_REARMS = (DeliveryStatus.DONE, DeliveryStatus.DEAD, DeliveryStatus.PENDING)


@dataclass(frozen=True)
class ReplayArming:
    armed_by_event: dict[int, int]  # raw event id -> deliveries (re)armed, new ones included
    already_queued: int  # deliveries left as they were (running, or held by a pause)
    superseded_kept: int  # superseded deliveries a replay without force leaves alone


def deliveries_arm_for_replay(
    events: list[RawEvent], *, force: bool, now: datetime
) -> ReplayArming:
    """(Re)arm every delivery of these verified events, inside the caller's transaction.

    A delivery is created for each handler registered since the event was settled; the
    existing ones are re-armed with their attempts reset, in one UPDATE for the batch. An
    ordered handler's re-armed delivery takes its turn in its key again: it runs if no newer
    event of the key was handled meanwhile, else it is superseded — unless `force`, which
    re-arms superseded ones too and runs them regardless (still one at a time per key).
    """
    if not events:
        return ReplayArming({}, 0, 0)
    rows = Delivery.objects.filter(raw_event_id__in=[e.id for e in events])
    existing = list(rows.values_list("raw_event_id", "handler", "status"))
    already_queued = sum(
        status in (DeliveryStatus.PROCESSING, DeliveryStatus.HELD) for *_, status in existing
    )
    superseded = sum(status == DeliveryStatus.SUPERSEDED for *_, status in existing)
    rearms = (*_REPLAY_REARMS, DeliveryStatus.SUPERSEDED) if force else _REPLAY_REARMS
    # Only the rows to re-arm are locked, in id order: a running delivery is never waited
    # for (its batch, which also stamps the event handled, would wait for our event lock).
    armed = list(
        rows.filter(status__in=rearms)
        .select_for_update()
        .order_by("id")
        .values_list("id", "raw_event_id", "handler")
    )
    armed_ids = [(delivery_id, raw_event_id) for delivery_id, raw_event_id, _ in armed]
    # What an active pause covers is armed `held` at once: visible and counted as held, and
    # an ordered key's later deliveries are not left pending behind a held head (the claim
    # would never reach them to hold them: only a key's head is looked at).
    paused = _paused_among(armed)
    for status, ids in (
        (DeliveryStatus.PENDING, [i for i, _ in armed_ids if i not in paused]),
        (DeliveryStatus.HELD, [i for i, _ in armed_ids if i in paused]),
    ):
        if ids:
            Delivery.objects.filter(id__in=ids).update(
                status=status,
                next_attempt_at=now,
                superseded_by=None,
                forced=force,
                **_ARMED_AFRESH,
            )
    handled = {(event_id, handler) for event_id, handler, _ in existing}
    new: list[Delivery] = []
    for event in events:
        specs = [
            spec
            for spec in handlers_for(event.provider, event.event_type)
            if (event.id, spec.name) not in handled
        ]
        new += deliveries_for_event(event, specs, now)
    held_new = _paused_among([(n, d.raw_event_id, d.handler) for n, d in enumerate(new)])
    for n in held_new:
        new[n].status = DeliveryStatus.HELD
    # ignore_conflicts: a settle of the same event that created the row since our read wins
    # (then it is pending and due already).
    Delivery.objects.bulk_create(new, ignore_conflicts=True)
    armed_by_event: dict[int, int] = {}
    for _, raw_event_id in armed_ids:
        armed_by_event[raw_event_id] = armed_by_event.get(raw_event_id, 0) + 1
    for delivery in new:
        armed_by_event[delivery.raw_event_id] = armed_by_event.get(delivery.raw_event_id, 0) + 1
    return ReplayArming(armed_by_event, already_queued, 0 if force else superseded)


def deliveries_rearm_dead(delivery_ids: list[int], *, now: datetime) -> int:
    """Dead deliveries back to `pending`, attempts reset; the others untouched. Returns how
    many. Inside the caller's transaction."""
    dead = Delivery.objects.filter(id__in=delivery_ids, status=DeliveryStatus.DEAD)
    # The events first, then their deliveries: the order a replay locks them in, so that a
    # replay and a re-arm of the same events never deadlock.
    events = dead.values("raw_event_id")
    list(RawEvent.objects.select_for_update().filter(id__in=events).order_by("id").values("id"))
    locked = list(
        dead.select_for_update().order_by("id").values_list("id", "raw_event_id", "handler")
    )
    rows = [(delivery_id, raw_event_id) for delivery_id, raw_event_id, _ in locked]
    paused = _paused_among(locked)  # armed held, as a replay arms them (see there)
    for status, ids in (
        (DeliveryStatus.PENDING, [i for i, _ in rows if i not in paused]),
        (DeliveryStatus.HELD, [i for i, _ in rows if i in paused]),
    ):
        if ids:
            Delivery.objects.filter(id__in=ids).update(
                status=status, next_attempt_at=now, **_ARMED_AFRESH
            )
    # The event is no longer handled: its lag shows again until the delivery finishes.
    RawEvent.objects.filter(id__in={raw_event_id for _, raw_event_id in rows}).update(
        handled_at=None
    )
    return len(rows)


@dataclass(frozen=True)
class _Claimed:
    id: int
    raw_event_id: int
    handler: str
    attempts: int  # this one included, since the delivery was last armed
    number: int  # lifetime attempt number, for the history
    claimed_at: datetime  # with attempts, the fence of every outcome recorded for it
    # Its first charged failure since it was armed (the horizon counts from it), and since
    # when it has waited on failures not its own (its release backoff).
    first_failed_at: datetime | None = None
    waiting_since: datetime | None = None


@dataclass(frozen=True)
class _Failure:
    claimed: _Claimed
    failure: Failure  # kernel.retry.classify: the one classification table
    error: str
    started: datetime


def _delivery_sql(sql: str) -> str:
    return sql.replace("{table}", connection.ops.quote_name(Delivery._meta.db_table))


# Marks the rows of `c` claimed: processing, the attempt charged (the claim is the attempt).
_MARK_CLAIMED = (
    " UPDATE {table} AS d SET status = 'processing', claimed_at = %(now)s,"
    " attempts = d.attempts + 1, total_attempts = d.total_attempts + 1 FROM c WHERE d.id = c.id"
    " RETURNING d.id, d.raw_event_id, d.handler, d.attempts, d.total_attempts,"
    " d.first_failed_at, d.waiting_since, d.worker_deaths"
)
# The unordered queue's claim, one statement (as procrastinate's procrastinate_fetch_job).
# `due`: the oldest due rows, locked. `c`: the claimed prefix — the first row always, then
# rows while none of them (this one included) has worker deaths: such a suspect is claimed
# alone, by itself first in line or in the next claim, so that a death is about one row.
_CLAIM_UNORDERED = _delivery_sql(
    "WITH due AS (SELECT id, next_attempt_at, worker_deaths FROM {table}"  # noqa: S608 (constants)
    " WHERE status = 'pending' AND next_attempt_at <= %(now)s AND ordering_key = ''"
    " ORDER BY next_attempt_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED),"
    " c AS (SELECT id FROM (SELECT id, row_number() OVER w AS n,"
    " bool_or(worker_deaths > 0) OVER w AS suspect FROM due"
    " WINDOW w AS (ORDER BY next_attempt_at, id ROWS UNBOUNDED PRECEDING)) AS w"
    " WHERE n = 1 OR NOT suspect)" + _MARK_CLAIMED
)
# Ordering keys' heads, found and locked under their keys' locks by _claim_key_heads.
_CLAIM_HEADS = _delivery_sql("WITH c AS (SELECT unnest(%(ids)s::bigint[]) AS id)" + _MARK_CLAIMED)


def _claim_due_deliveries(limit: int, now: datetime) -> list[_Claimed]:
    """The one place deliveries are claimed: up to `limit` due unordered deliveries (one
    statement) and up to `limit` heads of ordering keys, in one short transaction that marks
    them `processing` and charges the attempt. What a pause covers is held instead, its
    attempt given back, before anything runs."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_CLAIM_UNORDERED, {"now": now, "limit": limit})
        rows = _hold_claimed_paused(cursor.fetchall())
        heads, superseded = _claim_key_heads(limit, now)
        heads = _suspects_alone(heads, beside=rows)
        if heads:
            cursor.execute(_CLAIM_HEADS, {"now": now, "ids": [row[0] for row in heads]})
            rows += cursor.fetchall()
    if superseded:
        # After the claim's commit: the claim locks no raw event, so it can never be one
        # half of a deadlock with a replay (which locks the events, then their deliveries).
        _mark_events_handled(superseded, now)
    return [
        _Claimed(id, event_id, handler, attempts, total, now, first_failed_at, waiting_since)
        for id, event_id, handler, attempts, total, first_failed_at, waiting_since, _ in rows
    ]


def _suspects_alone(heads: list[tuple], *, beside: list[tuple]) -> list[tuple]:
    """The key heads (…, worker deaths last) to claim beside the unordered rows just claimed
    (worker deaths last too), so that a delivery with worker deaths is claimed alone, as the
    unordered claim does: none beside a suspect; beside others, the heads up to the first
    suspect; alone, a suspect first in line by itself. The heads left out wait for a later
    pass (their keys' locks end with the claim's transaction)."""
    if any(row[-1] > 0 for row in beside):
        return []
    if heads and heads[0][-1] > 0 and not beside:
        return heads[:1]
    prefix = []
    for head in heads:
        if head[-1] > 0:
            break
        prefix.append(head)
    return prefix


def _hold_claimed_paused(rows: list[tuple]) -> list[tuple]:
    """Hold the just-claimed rows (id, raw event id, handler, …) that a pause covers, their
    attempt given back; returns the others. Whatever made them pending (created before the
    pause was seen, a retry, a replay, a stale re-arm), a paused handler never runs."""
    held = _paused_among([(row[0], row[1], row[2]) for row in rows])
    if not held:
        return rows
    Delivery.objects.filter(id__in=held).update(
        status=DeliveryStatus.HELD,
        claimed_at=None,
        attempts=F("attempts") - 1,
        total_attempts=F("total_attempts") - 1,
    )
    return [row for row in rows if row[0] not in held]


def _hold_paused(rows: list[tuple]) -> list[tuple]:
    """Hold the locked pending rows (id, raw event id, handler, …) that a pause covers (a
    key's head: its key waits for the resume); returns the others."""
    held = _paused_among([(row[0], row[1], row[2]) for row in rows])
    if not held:
        return rows
    Delivery.objects.filter(id__in=held).update(status=DeliveryStatus.HELD)
    return [row for row in rows if row[0] not in held]


# --- ordered handlers: one delivery per key at a time, never an older after a newer ---------
#
# A key's *head* is its oldest unfinished delivery (held ones included: a key whose head
# a pause holds waits for the resume, never runs past it), by (event_time, raw_event_id). Only a
# head that is pending and due is ever claimed, and only by a worker holding the key's
# transaction-level advisory lock, taken with pg_try_advisory_xact_lock — the SKIP LOCKED of
# keys: a key another worker is deciding about right now is skipped this pass, never waited
# for. Under the lock, a fresh statement sees every claim committed before it: if a delivery
# of the key is running, or the head changed (an older event arrived since), the key waits;
# if a newer event of the key was already handled, the head is superseded instead of run.
# The claim commits (head `processing`) before the lock is released, so two workers never
# run one key at once, and the key's order cannot depend on which worker claims what.
#
# A head in backoff holds its key back until it is due or dead: strict order means the
# newer events wait behind the older one's retries. So does a running delivery whose worker
# died, until deliveries_rearm_stale re-arms it (DELIVERY_STALE_AFTER_SECONDS). Other keys,
# and unordered handlers, go on meanwhile. Every such state has a deadline and a way out:
# a head that fails for good dies (at once if permanent, after DELIVERY_MAX_ATTEMPTS if
# not) and its key goes on; a head in backoff runs now if its event is replayed (attempts
# reset); a dead worker's claim is re-armed as stale; a held head waits for its resume.
# Cost: a few statements more per pass, only while ordered deliveries are unfinished (the
# head query reads a partial index of those alone, the per-key reads are three index probes
# a key). Finding the heads walks the keys (a skip scan, up to _SKIP_SCAN_MAX_KEYS of them)
# rather than sorting every unfinished ordered delivery: a large backlog on few keys costs
# little; past that many keys the sorted read is used (bench/ordered_claim.py).

# The advisory lock space of these keys: pg_try_advisory_xact_lock(ORDERING_LOCK_CLASS,
# hashtext(handler || ' ' || key)). The two-int form is a key space of its own, apart from
# the one-bigint locks of partition maintenance and restore. A hash collision only makes
# two keys wait for each other within one claim.
ORDERING_LOCK_CLASS = 0x6F72_6465  # b"orde"


# The heads of every key: one sorted read of all unfinished ordered deliveries. Its cost
# grows with the deliveries, however few keys they share.
_KEY_HEADS = _delivery_sql(
    "SELECT id FROM ("
    "  SELECT DISTINCT ON (handler, ordering_key) id, status, next_attempt_at"
    "  FROM {table} WHERE ordering_key <> '' AND status IN ('pending', 'processing', 'held')"
    "  ORDER BY handler, ordering_key, event_time, raw_event_id"
    ") AS heads WHERE status = 'pending' AND next_attempt_at <= %s "
    "ORDER BY next_attempt_at LIMIT %s"
)
# The same heads by a skip scan of the key index: one descent per key (the first entry
# after the previous key), so its cost grows with the keys, however many deliveries wait
# behind them — a backlog on few keys (a blocked or paused one) costs a few index probes.
# Walked only up to _SKIP_SCAN_MAX_KEYS keys: past that (many keys, few deliveries each)
# the sorted read above is the cheaper one, and the claim falls back to it (the heads are
# the same either way). bench/ordered_claim.py measures both.
_KEY_HEADS_SKIP_SCAN = _delivery_sql(
    "WITH RECURSIVE heads AS ("
    "  (SELECT 1 AS n, handler, ordering_key, id, status, next_attempt_at FROM {table}"
    "   WHERE ordering_key <> '' AND status IN ('pending', 'processing', 'held')"
    "   ORDER BY handler, ordering_key, event_time, raw_event_id LIMIT 1)"
    "  UNION ALL"
    "  SELECT h.n + 1, nxt.* FROM heads AS h CROSS JOIN LATERAL ("
    "   SELECT handler, ordering_key, id, status, next_attempt_at FROM {table} AS d"
    "   WHERE d.ordering_key <> '' AND d.status IN ('pending', 'processing', 'held')"
    "   AND (d.handler, d.ordering_key) > (h.handler, h.ordering_key)"
    "   ORDER BY d.handler, d.ordering_key, d.event_time, d.raw_event_id LIMIT 1"
    "  ) AS nxt WHERE h.n <= %s"
    ") SELECT id, status = 'pending' AND next_attempt_at <= %s, next_attempt_at, n FROM heads"
)
_SKIP_SCAN_MAX_KEYS = 200
# After a walk found more keys than that, this worker goes straight to the sorted read for
# this many passes before walking again: the many-keys case pays for one wasted walk
# (bench/ordered_claim.py measures it) every so often, not every pass.
_SORTED_READ_PASSES = 20


@dataclass
class _HeadReadChoice:
    sorted_passes_left: int = 0


_head_read = _HeadReadChoice()  # per worker process; only a cost decision, never a verdict


def _key_head_candidates(cursor, limit: int, now: datetime) -> list[int]:
    """The ids of up to `limit` key heads that are pending and due, the longest due first."""
    if _head_read.sorted_passes_left <= 0:  # (threads of one worker may race here: harmless)
        cursor.execute(_KEY_HEADS_SKIP_SCAN, [_SKIP_SCAN_MAX_KEYS, now])
        rows = cursor.fetchall()
        if not rows or rows[-1][3] <= _SKIP_SCAN_MAX_KEYS:  # the walk saw every key
            due = sorted((at, id) for id, claimable, at, _ in rows if claimable)
            return [id for _, id in due[:limit]]
        _head_read.sorted_passes_left = _SORTED_READ_PASSES  # more keys than the walk takes
    _head_read.sorted_passes_left -= 1
    cursor.execute(_KEY_HEADS, [now, limit])
    return [row[0] for row in cursor.fetchall()]


_KEY_LOCKS = (
    "SELECT k.n, pg_try_advisory_xact_lock(%s, hashtext(k.handler || ' ' || k.key)) "
    "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS k(handler, key, n) ORDER BY k.n"
)
# Fresh, after the locks: per key, whether a delivery is running, which pending one is the
# head now, and the newest handled one. Three index probes per key (`ordering_key <> ''`
# lets the planner use the partial indexes), never a scan of the key's whole history.
_KEY_PROBE = (
    "SELECT k.handler, k.key, r.status, r.id, r.event_time, r.raw_event_id FROM k"
    " CROSS JOIN LATERAL (SELECT status, id, event_time, raw_event_id FROM {table} AS d"
    "  WHERE d.handler = k.handler AND d.ordering_key = k.key AND d.ordering_key <> ''"
    "  AND d.status IN (%(status)s) ORDER BY d.event_time %(order)s, d.raw_event_id %(order)s"
    "  LIMIT 1) AS r"
)
_KEY_STATE = _delivery_sql(
    "WITH k AS (SELECT * FROM unnest(%s::text[], %s::text[]) AS k(handler, key)) "  # noqa: S608 (constants only)
    + " UNION ALL ".join(
        _KEY_PROBE.replace("%(status)s", status).replace("%(order)s", order)
        # A held delivery is a head too: its key waits for its pause to end (if the probe
        # finds it, the pending one is not the head), so a pause never reorders a key.
        for status, order in (
            ("'processing'", "ASC"),
            ("'pending', 'held'", "ASC"),
            ("'done'", "DESC"),
        )
    )
)


def _claim_key_heads(limit: int, now: datetime) -> tuple[list[tuple], set[int]]:
    """The heads of ordering keys to claim now (locked, pending; the caller marks them
    claimed), and the raw events of the heads it superseded instead (they lost to a newer
    handled event of their key)."""
    with connection.cursor() as cursor:
        candidates = _key_head_candidates(cursor, limit, now)
    if not candidates:
        return [], set()
    rows = list(
        Delivery.objects.select_for_update(skip_locked=True)
        .filter(id__in=candidates, status=DeliveryStatus.PENDING)
        .order_by("next_attempt_at")
        .values_list(
            "id",
            "raw_event_id",
            "handler",
            "attempts",
            "total_attempts",
            "ordering_key",
            "event_time",
            "forced",
            "worker_deaths",
        )
    )
    rows = _hold_paused(rows)
    if not rows:
        return [], set()
    with connection.cursor() as cursor:
        cursor.execute(
            _KEY_LOCKS, [ORDERING_LOCK_CLASS, [r[2] for r in rows], [r[5] for r in rows]]
        )
        locked = [rows[n - 1] for n, got in cursor.fetchall() if got]
        if not locked:
            return [], set()
        cursor.execute(_KEY_STATE, [[r[2] for r in locked], [r[5] for r in locked]])
        state = {(h, k, status): (i, t, e) for h, k, status, i, t, e in cursor.fetchall()}
    claimed, superseded = [], []
    for row in locked:
        delivery_id, raw_event_id, handler, _, _, key, event_time, forced, _ = row
        if (handler, key, DeliveryStatus.PROCESSING) in state:
            continue  # one of the key's deliveries is running
        head = state.get((handler, key, DeliveryStatus.PENDING))
        if head is None or head[0] != delivery_id:
            continue  # an older one arrived since the candidates were read: next pass
        newest = state.get((handler, key, DeliveryStatus.DONE))
        if newest is not None and not forced and newest[1:] > (event_time, raw_event_id):
            superseded.append((delivery_id, raw_event_id, newest[0]))
            continue
        claimed.append((*row[:5], row[8]))  # (id, event, handler, attempts, total, deaths)
    for delivery_id, raw_event_id, newer_id in superseded:
        # Finished without running, visibly: with the delivery it lost to.
        Delivery.objects.filter(id=delivery_id).update(
            status=DeliveryStatus.SUPERSEDED, superseded_by_id=newer_id, finished_at=now
        )
        logger.info(
            "ingress.deliver.superseded",
            extra={"delivery_id": delivery_id, "raw_event_id": raw_event_id, "by": newer_id},
        )
    return claimed, {raw_event_id for _, raw_event_id, _ in superseded}


def _paused_among(
    rows: list[tuple[int, int, str]], *, besides: tuple[str, str] | None = None
) -> set[int]:
    """The ids among (delivery id, raw event id, handler) that an active pause covers (any
    but the (handler, source) pause `besides`, the one being resumed)."""
    if not rows:
        return set()
    active = HandlerPause.objects.filter(resumed_at__isnull=True)
    if besides is not None:
        active = active.exclude(handler=besides[0], source=besides[1])
    pauses = list(active.values_list("handler", "source"))
    if not pauses:
        return set()
    handlers = {handler for handler, _ in pauses if handler}
    sources = {source for _, source in pauses if source}
    paused_events: set[int] = set()
    if sources:
        paused_events = set(
            RawEvent.objects.filter(
                id__in={row[1] for row in rows}, source__in=sources
            ).values_list("id", flat=True)
        )
    return {
        delivery_id
        for delivery_id, raw_event_id, handler in rows
        if handler in handlers or raw_event_id in paused_events
    }


def _mark_events_handled(
    raw_event_ids: set[int], now: datetime, *, received: list[datetime] | None = None
) -> None:
    """Stamp handled_at on events whose deliveries have all finished (done or dead).

    `received`: the events' received_at when the caller has them. The table is partitioned
    by day on it and an id alone prunes nothing, so the UPDATE would probe every day's
    partition (90 kept + 7 ahead in production); bounded by the oldest and newest it reads
    only theirs.
    """
    unfinished = Delivery.objects.filter(
        raw_event_id=OuterRef("id"), status__in=UNFINISHED_DELIVERY_STATUSES
    )
    rows = RawEvent.objects.filter(id__in=raw_event_ids, handled_at__isnull=True)
    if received:
        rows = rows.filter(received_at__range=(min(received), max(received)))
    rows.exclude(Exists(unfinished)).update(handled_at=now)


def _call_handler(claimed: _Claimed, events: dict[int, RawEvent]) -> str:
    """Run the delivery's handler; returns its note ("" for none)."""
    event = events.get(claimed.raw_event_id)
    if event is None:
        raise PermanentHandlerError(f"raw event #{claimed.raw_event_id} no longer exists")
    spec = get_handler(claimed.handler)
    if spec is None:
        raise PermanentHandlerError(HANDLER_MISSING.format(name=claimed.handler))
    payload = parse_payload(raw_event_headers(event), raw_event_body(event))
    return handler_note(spec.func(event, payload))


# The claims of a batch as a row set (id, attempts, claimed_at): the fence of its outcomes.
_CLAIMS = (
    "json_to_recordset(%(claims)s::json) AS c(id bigint, attempts integer, claimed_at timestamptz)"
)
_FENCE = (
    "d.id = c.id AND d.attempts = c.attempts AND d.claimed_at = c.claimed_at"
    " AND d.status = 'processing'"
)
# Locks the batch's rows that are still its claims, for the whole batch: a row re-armed and
# claimed by another worker meanwhile is not among them (and not run), and the re-arm skips
# a row this batch holds (SKIP LOCKED), so no live batch is ever re-armed under it.
_LOCK_CLAIMS = _delivery_sql(
    f"SELECT d.id FROM {{table}} AS d JOIN {_CLAIMS} ON {_FENCE} ORDER BY d.id FOR UPDATE OF d"  # noqa: S608 (constants)
)
# The success, fenced like every other outcome.
_MARK_DONE = _delivery_sql(
    f"UPDATE {{table}} AS d SET status = 'done', finished_at = %(finished)s, last_error = '',"  # noqa: S608 (constants)
    f" waiting_since = NULL, worker_deaths = 0 FROM {_CLAIMS} WHERE {_FENCE}"
)


def _claims_json(claimed: list[_Claimed]) -> str:
    return json_rows(
        ("id", "attempts", "claimed_at"),
        ((item.id, item.attempts, item.claimed_at) for item in claimed),
    )


def _lock_claims(claimed: list[_Claimed]) -> list[_Claimed]:
    """Lock the claims still ours (see _LOCK_CLAIMS); the others are lost claims, logged."""
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_CLAIMS, {"claims": _claims_json(claimed)})
        held = {row[0] for row in cursor.fetchall()}
    for item in claimed:
        if item.id not in held:
            logger.warning(
                "ingress.deliver.lost_claim",
                extra={"delivery_id": item.id, "attempt": item.attempts},
            )
    return [item for item in claimed if item.id in held]


def _record_failure(failure: _Failure) -> None:
    claimed = failure.claimed
    # A handler's message may hold a NUL or a lone surrogate: recording it must not fail.
    error = storable_text(failure.error)[:4000]
    now = timezone.now()
    decision = delivery_retry_strategy().decide(
        failure.failure,
        attempts=claimed.attempts,
        now=now,
        first_failed_at=claimed.first_failed_at,
        waiting_since=claimed.waiting_since,
    )
    # Fenced on (claimed_at, attempts): a worker whose delivery was re-armed as stale and
    # claimed again meanwhile cannot overwrite the newer run.
    row = fenced(
        Delivery.objects.filter(id=claimed.id),
        claimed_at=claimed.claimed_at,
        attempts=claimed.attempts,
        processing=DeliveryStatus.PROCESSING,
    )
    with transaction.atomic():
        if decision.action == Action.GIVE_UP:
            permanent = failure.failure.disposition == Disposition.PERMANENT
            outcome = (
                DeliveryAttempt.Outcome.PERMANENT if permanent else DeliveryAttempt.Outcome.DEAD
            )
            updated = row.update(
                status=DeliveryStatus.DEAD, finished_at=now, last_error=error, worker_deaths=0
            )
            if updated:
                _mark_events_handled({claimed.raw_event_id}, now)
        elif decision.action == Action.RETRY:
            outcome = DeliveryAttempt.Outcome.TRANSIENT
            updated = row.update(
                status=DeliveryStatus.PENDING,
                next_attempt_at=decision.retry_at,
                claimed_at=None,
                last_error=error,
                first_failed_at=Coalesce("first_failed_at", Value(now)),
                waiting_since=None,
                worker_deaths=0,
            )
        else:
            # Not about the delivery (our database): the attempt is given back, and it waits
            # longer the longer it has waited.
            outcome = DeliveryAttempt.Outcome.RELEASED
            updated = row.update(
                status=DeliveryStatus.PENDING,
                next_attempt_at=decision.retry_at,
                claimed_at=None,
                last_error=error,
                attempts=F("attempts") - 1,
                waiting_since=Coalesce("waiting_since", Value(now)),
                worker_deaths=0,
            )
        if not updated:
            logger.warning("ingress.deliver.lost_claim", extra={"delivery_id": claimed.id})
            return
        DeliveryAttempt.objects.create(
            delivery_id=claimed.id,
            number=claimed.number,
            started_at=failure.started,
            finished_at=now,
            outcome=outcome,
            error=error,
        )
    logger.warning(
        "ingress.deliver.failed",
        extra={
            "delivery_id": claimed.id,
            "raw_event_id": claimed.raw_event_id,
            "handler": claimed.handler,
            "attempt": claimed.attempts,
            "outcome": outcome,
        },
    )


def deliveries_run_due(*, limit: int | None = None, now: datetime | None = None) -> int:
    """Claim and run up to `limit` due deliveries. Returns how many were run.

    The batch runs in one transaction (`_run_claimed`: a savepoint per handler only once one
    of them has raised): a handler's writes and its delivery's `done` commit together, a
    failing handler rolls back only its own savepoint, and the batch pays for one commit
    (one WAL flush) instead of one per event. Should the batch fail outside a handler's
    savepoint — a handler's write that only fails
    at COMMIT (PostgreSQL checks Django's foreign keys there), say — it is run again one
    delivery per transaction, and a delivery that fails on its own is charged like any
    transient failure. Should our database fail, every delivery of the batch not finished
    is given back (`pending`, the attempt given back, due at once): at once if the
    connection still works, else first thing on the next pass — handlers are idempotent, so
    running again is safe, and no worker death is counted for them. Handlers must
    therefore be quick and touch only the database (slow work goes through an outbox), or
    they would hold the batch's locks.
    """
    deliveries_give_back_unreturned()
    claimed = _claim_due_deliveries(limit or settings.INBOX_BATCH_SIZE, now or timezone.now())
    if not claimed:
        return 0
    try:
        return _run_and_record(claimed)
    except BaseException:
        # Not finished, and this worker lives: given back (fenced: what was recorded stays).
        _give_back(claimed)
        raise


def _run_and_record(claimed: list[_Claimed]) -> int:
    """Run the claimed batch and record its failures; returns how many ran."""
    events = RawEvent.objects.in_bulk({item.raw_event_id for item in claimed})
    claimed = _release_unreadable(claimed, events)
    try:
        failures = _run_claimed(claimed, events)
    except DATABASE_UNAVAILABLE:
        raise
    except Exception as exc:
        logger.warning(
            "ingress.deliver.batch_failed",
            extra={"deliveries": len(claimed), "error": type(exc).__name__},
        )
        failures = []
        for item in claimed:
            started = timezone.now()
            try:
                failures += _run_claimed([item], events)
            except DATABASE_UNAVAILABLE:
                raise
            except Exception as exc:
                failures.append(_Failure(item, classify(exc), _describe(exc), started))
    for failure in failures:
        try:
            _record_failure(failure)
        except DATABASE_UNAVAILABLE:
            raise
        except Exception as exc:
            # The last net: the claim is given back, uncharged, as for a database failure
            # (the worker lives: nothing here is a death).
            logger.error(
                "ingress.deliver.record_failed",
                extra={"delivery_id": failure.claimed.id, "error": type(exc).__name__},
            )
            _give_back([failure.claimed])
    return len(claimed)


# A claim given back by the worker that made it (fenced on it): `pending`, due at once, the
# attempt given back. The worker lived, so this is no death.
_GIVE_BACK = _delivery_sql(
    f"UPDATE {{table}} AS d SET status = 'pending', claimed_at = NULL,"  # noqa: S608 (constants)
    f" next_attempt_at = %(now)s, attempts = d.attempts - 1 FROM {_CLAIMS} WHERE {_FENCE}"
)

# Claims this process made and could not finish while it lived on, not yet given back (our
# database was unavailable): given back first thing on the next pass.
_unreturned: list[_Claimed] = []


def _give_back(claimed: list[_Claimed]) -> None:
    _unreturned.extend(claimed)
    # Still unavailable: the next pass tries again, before it claims anything.
    with contextlib.suppress(*DATABASE_UNAVAILABLE):
        deliveries_give_back_unreturned()


def deliveries_give_back_unreturned() -> int:
    """Give back the claims this process could not finish (see _GIVE_BACK), one statement.
    Returns how many were still its own. Raises while our database is unavailable (the
    claims stay owed)."""
    if not _unreturned:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(_GIVE_BACK, {"claims": _claims_json(_unreturned), "now": timezone.now()})
        given = cursor.rowcount
    _unreturned.clear()
    if given:
        logger.warning("ingress.deliver.claims_given_back", extra={"deliveries": given})
    return given


# How long a delivery whose body we cannot decrypt waits before it is claimed again.
KEY_MISSING_RECHECK_SECONDS = 60


def _release_unreadable(claimed: list[_Claimed], events: dict[int, RawEvent]) -> list[_Claimed]:
    """Deliveries whose event's body is under a key RAW_EVENT_ENCRYPTION_KEYS no longer holds
    go back to `pending`, uncharged: our configuration, not the delivery's fault, so it must
    not run out its attempts and die while the key is being put back. Returns the others."""
    known = keyring().known_ids
    unreadable = {
        item.id
        for item in claimed
        if (event := events.get(item.raw_event_id)) is not None
        and event.body_encryption not in known
    }
    if not unreadable:
        return claimed
    Delivery.objects.filter(id__in=unreadable, status=DeliveryStatus.PROCESSING).update(
        status=DeliveryStatus.PENDING,
        claimed_at=None,
        attempts=F("attempts") - 1,
        total_attempts=F("total_attempts") - 1,
        next_attempt_at=timezone.now() + timedelta(seconds=KEY_MISSING_RECHECK_SECONDS),
    )
    logger.warning("ingress.deliver.encryption_key_missing", extra={"deliveries": len(unreadable)})
    return [item for item in claimed if item.id not in unreadable]


class _HandlerRaised(Exception):
    """A handler of the optimistic pass raised: its batch is rolled back and run isolated."""

    def __init__(self, failure: _Failure, exc: Exception):
        super().__init__(failure.error)
        self.failure = failure
        self.exc = exc


def _run_claimed(claimed: list[_Claimed], events: dict[int, RawEvent]) -> list[_Failure]:
    """Run the handlers in one transaction; returns the failed ones.

    Optimistically first, without a savepoint per handler: on the usual path every handler
    returns, and a savepoint each would cost two round trips per delivery (SAVEPOINT and
    RELEASE, 29 % of the workers' time in docs/benchmarks.md) for nothing. Should a handler
    raise, the whole batch is rolled back — nothing of it is committed, and handlers are
    idempotent and touch only the database — and run again a savepoint each, so that only
    the failing one is charged (with its error) and the others are done once. The same
    pattern as the verify side: one savepoint per batch, per row only on failure.
    """
    try:
        return _run_claimed_batch(claimed, events, isolated=False)
    except _HandlerRaised as raised:
        cause = raised.exc
        if isinstance(cause, DATABASE_UNAVAILABLE) and connection.connection is None:
            # The rollback failed too and Django closed the connection: our database is
            # down, not a handler's fault. Propagated as it always was (the batch stays
            # `processing`), not run a second time against a reconnect.
            raise cause from None
        logger.info(
            "ingress.deliver.batch_isolated",
            extra={"deliveries": len(claimed), "error": type(cause).__name__},
        )
        # The handler's own exception is charged as it was raised, not called a second time
        # for the same attempt. A database error is not taken as proof: it may be the
        # aftermath of an earlier handler that swallowed one (the transaction aborted
        # under it), so that handler is run again in its savepoint, where today's rules
        # charge whichever handler really failed.
        known = None if isinstance(cause, DatabaseError) else raised.failure
    return _run_claimed_batch(claimed, events, isolated=True, known=known)


def _run_claimed_batch(
    claimed: list[_Claimed],
    events: dict[int, RawEvent],
    *,
    isolated: bool,
    known: _Failure | None = None,
) -> list[_Failure]:
    failures: list[_Failure] = []
    with transaction.atomic():
        claimed = _lock_claims(claimed)
        attempts: list[DeliveryAttempt] = []
        for item in claimed:
            if known is not None and item.id == known.claimed.id:
                failures.append(known)
                continue
            started = timezone.now()
            try:
                if isolated:
                    with transaction.atomic():
                        note = _call_handler(item, events)
                else:
                    note = _call_handler(item, events)
            except Exception as exc:
                failure = _Failure(item, classify(exc), _describe(exc), started)
                if not isolated:
                    # Out of the batch's atomic(): the batch rolls back, _run_claimed reruns it.
                    raise _HandlerRaised(failure, exc) from exc
                # kernel.retry.classify, the table the outbox uses too: PermanentHandlerError
                # and an unparseable body are verdicts; our database's errors are never
                # charged; anything unclassified is retried, charged (a handler only sees
                # verified events, and a bug fixed by the next deploy should not have
                # killed the event meanwhile), until max_attempts and the horizon; dead
                # deliveries can be re-armed from the console.
                failures.append(failure)
                continue
            attempts.append(
                DeliveryAttempt(
                    delivery_id=item.id,
                    number=item.number,
                    started_at=started,
                    finished_at=timezone.now(),
                    outcome=DeliveryAttempt.Outcome.DONE,
                    note=note,
                )
            )
        if attempts:
            finished = timezone.now()
            done_ids = {a.delivery_id for a in attempts}
            done = [item for item in claimed if item.id in done_ids]
            with connection.cursor() as cursor:
                cursor.execute(_MARK_DONE, {"claims": _claims_json(done), "finished": finished})
                if cursor.rowcount != len(done):
                    # Each row is locked by this transaction as our claim: a miss is a bug.
                    raise RuntimeError(f"marked {cursor.rowcount} of {len(done)} deliveries done")
            DeliveryAttempt.objects.bulk_create(attempts)
            done_events = {item.raw_event_id for item in claimed if item.id in done_ids}
            # A delivery is done only if its event was read (_call_handler), so all are here.
            received = [events[n].received_at for n in done_events]
            _mark_events_handled(done_events, finished, received=received)
    return failures


def _describe(exc: Exception) -> str:
    try:
        message = str(exc)
    except Exception:  # an exception whose __str__ raises must not take the batch with it
        message = "(message unprintable)"
    return f"{type(exc).__name__}: {message}"


# Deliveries `processing` past the stale threshold whose rows no live batch holds (a batch
# locks its claims for its whole run: _LOCK_CLAIMS), back to `pending`, the attempt given back.
_REARM_STALE = _delivery_sql(
    "WITH c AS (SELECT id, claimed_at FROM {table} WHERE status = 'processing'"
    " AND claimed_at < %(cutoff)s FOR UPDATE SKIP LOCKED)"
    " UPDATE {table} AS d SET"
    " status = CASE WHEN d.worker_deaths + 1 >= %(deaths)s THEN 'dead' ELSE 'pending' END,"
    " finished_at = CASE WHEN d.worker_deaths + 1 >= %(deaths)s THEN %(now)s END,"
    " last_error = CASE WHEN d.worker_deaths + 1 >= %(deaths)s"
    "  THEN format(%(error)s, d.worker_deaths + 1) ELSE d.last_error END,"
    " claimed_at = NULL, next_attempt_at = %(now)s, attempts = GREATEST(d.attempts - 1, 0),"
    " worker_deaths = d.worker_deaths + 1"
    " FROM c WHERE d.id = c.id"
    " RETURNING d.id, d.raw_event_id, d.handler, d.status, d.total_attempts, c.claimed_at,"
    " d.last_error, d.worker_deaths"
)
# A delivery's last_error when it is set aside (PostgreSQL's format(): %s is the count).
WORKER_DIED_ERROR = (
    "worker_died: its worker died %s times in a row running it (killed, out of memory, a "
    "crash); re-arm it once the cause is fixed"
)


def deliveries_rearm_stale(*, now: datetime | None = None) -> int:
    """Deliveries left `processing` by a worker that died go back to `pending`, in one
    statement, with the attempt the claim charged given back: a death is no charged attempt.
    Returns how many.

    A worker that lives gives back what it could not finish (deliveries_run_due), so what
    is left here is a death (killed, out of memory, a crash, its host lost): counted on the
    row (`worker_deaths`, reset by any outcome recorded later). A delivery with deaths is
    claimed alone; at INBOX_MAX_WORKER_DEATHS it is `dead` instead (`worker_died`, a history
    entry with it), never claimed again unless re-armed.

    A row a live batch holds is never taken (SKIP LOCKED: the batch locks its claims for its
    whole run), so a batch that outlives DELIVERY_STALE_AFTER_SECONDS, or a frozen worker
    whose connection lives on, is not run twice.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.DELIVERY_STALE_AFTER_SECONDS)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                _REARM_STALE,
                {
                    "cutoff": cutoff,
                    "now": now,
                    "deaths": settings.INBOX_MAX_WORKER_DEATHS,
                    "error": WORKER_DIED_ERROR,
                },
            )
            rows = cursor.fetchall()
        dead = [row for row in rows if row[3] == DeliveryStatus.DEAD]
        if dead:
            DeliveryAttempt.objects.bulk_create(
                DeliveryAttempt(
                    delivery_id=delivery_id,
                    number=number,
                    started_at=claimed_at,
                    finished_at=now,
                    outcome=DeliveryAttempt.Outcome.DEAD,
                    error=error,
                )
                for delivery_id, _, _, _, number, claimed_at, error, _ in dead
            )
            _mark_events_handled({row[1] for row in dead}, now)
    for delivery_id, raw_event_id, handler, _, _, _, _, deaths in dead:
        logger.error(
            "ingress.deliver.worker_died",
            extra={
                "delivery_id": delivery_id,
                "raw_event_id": raw_event_id,
                "handler": handler,
                "deaths": deaths,
            },
        )
    if len(rows) > len(dead):
        logger.warning("ingress.deliver.rearmed_stale", extra={"count": len(rows) - len(dead)})
    return len(rows)
