"""Flow 2: everything after the ACK — verify, deduplicate, deliver to handlers.

Two kinds of work, each claimed with `SELECT … FOR UPDATE SKIP LOCKED` so any number of
worker processes on any number of hosts can run side by side without double work:

1. `raw_events_verify_batch` claims `pending` raw events and, in the same short transaction,
   verifies each on its stored bytes, records the verdict, settles the dedup key (a unique
   index decides the winner), and creates one Delivery row per registered handler. The
   transaction commits verdict, dedup key and deliveries together: a crash in between
   leaves the event `pending` and it is simply claimed again.
2. `deliveries_run_due` claims due `pending` deliveries (marking them `processing` in a short
   transaction of its own), then runs each handler in its own transaction that also marks the
   delivery `done` — so a handler's writes and its "done" commit or roll back together.

Retry, backoff and giving up are properties of the rows (attempts, next_attempt_at, status),
never control flow held in memory.

One bad row never blocks the others. Both kinds of work settle a whole batch in one
transaction (the fast path: one commit per batch). Should that raise for anything but our
database being unavailable, the batch is done again row by row, each row on its own, so
only the rows that raise again are charged: a raw event gets a failure counted on it and a
not-before time, and after INBOX_MAX_ROW_FAILURES it is rejected `processing_failed`; a
delivery takes the usual transient-failure path (backoff, dead after DELIVERY_MAX_ATTEMPTS).
Bodies holding text PostgreSQL cannot store are rejected `unstorable_text` before any write.

A worker that dies (killed, out of memory) records nothing. A delivery it had claimed stays
`processing` and is re-armed as stale, still charged, and given up `dead` once its charged
attempts reach DELIVERY_MAX_ATTEMPTS (deliveries_rearm_stale). A raw event whose settling
kills the worker is not bounded yet: its claim is rolled back with the dying connection, so
nothing on the row counts the deaths, and the batch it belongs to is claimed again (and dies
again) every pass. Counting them would need a committed "claimed" mark before settling — a
second commit per batch on the fast path, which verification is designed not to pay. Until
then such a row shows as a worker in a crash loop with a growing
`raw_events_oldest_pending_age_seconds`, and no tool sets it aside yet (an open limit).
"""

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from eventdrop.db_roles import handler_role
from eventdrop.errors import EventDropError
from eventdrop.logformat import raised_at
from eventdrop.retry import (
    Action,
    Disposition,
    Failure,
    RetryPolicy,
    RetryStrategy,
    classify,
    fenced,
)
from ingress.encryption import keyring
from ingress.handlers import PermanentHandlerError, get_handler, handlers_for
from ingress.models import (
    DedupKey,
    Delivery,
    DeliveryAttempt,
    DeliveryStatus,
    DispatchStatus,
    RawEvent,
    RawEventOrigin,
    RejectionReason,
    SignatureStatus,
)
from ingress.payloads import (
    holds_unstorable_text,
    parse_payload,
    raw_event_body,
    raw_event_headers,
    storable_text,
)
from ingress.reconcile.verdict import backfilled_verdict
from ingress.sources import all_sources
from ingress.verifiers import StoredRequest, Verdict, verify

logger = logging.getLogger(__name__)

REPLAY_NOT_VERIFIED = "Event #{id} is {status}, not verified: only verified events are replayed."
REPLAY_DUPLICATE = "Event #{id} is a duplicate of #{original}: replay the original instead."
REVERIFY_NOT_REJECTED = "Event #{id} is {status}: only rejected events are re-verified."
HANDLER_MISSING = "handler {name} is no longer registered"
SETTLE_FAILED = "{error} in verify/dedup/dispatch"

# Our own database failing (connection lost, restart, statement or lock timeout, deadlock):
# not the row's fault, so never charged to one. The batch rolls back whole and the worker
# loop backs off; the rows are claimed again once the database answers.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)


class ReplayRefused(EventDropError):
    pass


class ReverifyRefused(EventDropError):
    pass


def delivery_retry_policy() -> RetryPolicy:
    return RetryPolicy(
        max_attempts=settings.DELIVERY_MAX_ATTEMPTS,
        base_seconds=settings.DELIVERY_BACKOFF_BASE_SECONDS,
        cap_seconds=settings.DELIVERY_BACKOFF_CAP_SECONDS,
    )


def delivery_retry_strategy() -> RetryStrategy:
    """The project's one retry decision (eventdrop/retry.py), with the delivery settings."""
    return RetryStrategy(policy=delivery_retry_policy())


# --- 1. verify, dedup, fan out -------------------------------------------------------------

# Headers that identify *what* was sent rather than *this attempt* at sending it; signature
# and timestamp headers change on every provider retry and would defeat the fallback key.
_FALLBACK_KEY_HEADERS = ("content-type",)


def dedup_key_for(event: RawEvent, verdict: Verdict) -> str:
    """The provider's own event id when it has one, else a content hash."""
    if verdict.provider_event_id:
        return f"id:{verdict.provider_event_id}"[:300]
    digest = hashlib.sha256()
    for part in (event.source, event.path, verdict.event_type):
        digest.update(part.encode("utf-8") + b"\0")
    headers = raw_event_headers(event)
    for name in _FALLBACK_KEY_HEADERS:
        digest.update(f"{name}:{headers.get(name, '')}".encode() + b"\0")
    digest.update(raw_event_body(event))  # the plaintext: ciphertexts differ every time
    return f"sha256:{digest.hexdigest()}"


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


def _settle_events(events: list[RawEvent], now: datetime) -> None:
    """Verify, dedup and fan out a batch of locked events. Runs inside the claim transaction."""
    verdicts = {event.id: _verdict_for(event) for event in events}
    accepted: list[RawEvent] = []
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
        # (no deadlock); ignore_conflicts is INSERT … ON CONFLICT DO NOTHING, and the SELECT
        # after it (a fresh snapshot under READ COMMITTED) tells who won each key — another
        # worker's committed row, or ours.
        keys = sorted(
            {(event.source, event.dedup_key): event for event in reversed(accepted)}.items()
        )
        DedupKey.objects.bulk_create(
            [DedupKey(source=s, key=k, raw_event_id=e.id, created_at=now) for (s, k), e in keys],
            ignore_conflicts=True,
        )
        winners = {
            (row.source, row.key): row.raw_event_id
            for row in DedupKey.objects.filter(
                key__in=[key for (_, key), _ in keys], source__in={s for (s, _), _ in keys}
            )
        }
        deliveries: list[Delivery] = []
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
            deliveries += [
                Delivery(raw_event_id=event.id, handler=spec.name, next_attempt_at=now)
                for spec in specs
            ]
        Delivery.objects.bulk_create(deliveries, ignore_conflicts=True)

    _save_settled(events)
    logger.info(
        "ingress.verify.batch_settled",
        extra={
            "events": len(events),
            "verified": len(accepted),
            "rejected": len(events) - len(accepted),
            "duplicates": sum(e.dispatch_status == DispatchStatus.DUPLICATE for e in accepted),
        },
    )


# The columns _settle_events decides. Written with one pipelined executemany rather than
# Model.bulk_update, whose CASE-per-column SQL costs more Python time than the verification
# itself; `received_at` in the WHERE lets PostgreSQL prune to the event's day partition.
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


def _save_settled(events: list[RawEvent]) -> None:
    ops = connection.ops
    assignments = ", ".join(f"{ops.quote_name(column)} = %s" for column in _SETTLED_COLUMNS)
    sql = (
        f"UPDATE {ops.quote_name(RawEvent._meta.db_table)} SET {assignments} "  # noqa: S608 (constant identifiers)
        "WHERE id = %s AND received_at = %s"
    )
    rows = []
    for event in events:
        values = [getattr(event, column) for column in _SETTLED_COLUMNS]
        values[_SETTLED_COLUMNS.index("verified_at")] = ops.adapt_datetimefield_value(
            event.verified_at
        )
        rows.append([*values, event.id, ops.adapt_datetimefield_value(event.received_at)])
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def raw_events_verify_batch(*, limit: int | None = None, now: datetime | None = None) -> int:
    """Claim up to `limit` due pending raw events, settle them, commit. Returns how many.

    The batch is settled under a savepoint; should that raise, it is rolled back and the
    same locked rows are settled one by one (`_settle_one_by_one`), so a poison row costs
    its batch one slower pass instead of stalling it.
    """
    limit = limit or settings.INBOX_BATCH_SIZE
    now = now or timezone.now()
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
                    _settle_events(events, now)
            except DATABASE_UNAVAILABLE:
                raise
            except Exception as exc:
                logger.warning(
                    "ingress.verify.batch_failed",
                    extra={"events": len(events), "error": type(exc).__name__},
                )
                _settle_one_by_one([event.id for event in events], now)
    return len(events)


def _settle_one_by_one(ids: list[int], now: datetime) -> None:
    """Settle each row under its own savepoint; charge the rows that raise (see below).

    The rows are read again: the failed batch left the objects half-updated in memory.
    They are still locked by this transaction, so nobody else has touched them.
    """
    for event in RawEvent.objects.filter(id__in=ids).order_by("received_at", "id"):
        try:
            with transaction.atomic():
                _settle_events([event], now)
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


# --- 2. run deliveries ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Claimed:
    id: int
    raw_event_id: int
    handler: str
    attempts: int  # this one included, since the delivery was last armed
    number: int  # lifetime attempt number, for the history
    claimed_at: datetime  # with attempts, the fence of every outcome recorded for it


@dataclass(frozen=True)
class _Failure:
    claimed: _Claimed
    failure: Failure  # eventdrop.retry.classify: the one classification table
    error: str
    started: datetime


def _claim_due_deliveries(limit: int, now: datetime) -> list[_Claimed]:
    with transaction.atomic():
        due = list(
            Delivery.objects.select_for_update(skip_locked=True)
            .filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
            .order_by("next_attempt_at")
            .values_list("id", "raw_event_id", "handler", "attempts", "total_attempts")[:limit]
        )
        if due:
            Delivery.objects.filter(id__in=[row[0] for row in due]).update(
                status=DeliveryStatus.PROCESSING,
                claimed_at=now,
                attempts=F("attempts") + 1,
                total_attempts=F("total_attempts") + 1,
            )
    return [
        _Claimed(id, event_id, handler, attempts + 1, total + 1, now)
        for id, event_id, handler, attempts, total in due
    ]


def _mark_events_handled(raw_event_ids: set[int], now: datetime) -> None:
    """Stamp handled_at on events whose deliveries have all finished (done or dead)."""
    unfinished = Delivery.objects.filter(
        raw_event_id=OuterRef("id"),
        status__in=[DeliveryStatus.PENDING, DeliveryStatus.PROCESSING],
    )
    RawEvent.objects.filter(id__in=raw_event_ids, handled_at__isnull=True).exclude(
        Exists(unfinished)
    ).update(handled_at=now)


def _call_handler(claimed: _Claimed, events: dict[int, RawEvent]) -> None:
    event = events.get(claimed.raw_event_id)
    if event is None:
        raise PermanentHandlerError(f"raw event #{claimed.raw_event_id} no longer exists")
    spec = get_handler(claimed.handler)
    if spec is None:
        raise PermanentHandlerError(HANDLER_MISSING.format(name=claimed.handler))
    payload = parse_payload(raw_event_headers(event), raw_event_body(event))
    # As DATABASE_HANDLER_ROLE when set: the inbox's own role cannot touch business tables.
    with handler_role():
        spec.func(event, payload)


def _record_failure(failure: _Failure) -> None:
    claimed = failure.claimed
    # A handler's message may hold a NUL or a lone surrogate: recording it must not fail.
    error = storable_text(failure.error)[:4000]
    now = timezone.now()
    decision = delivery_retry_strategy().decide(
        failure.failure, attempts=claimed.attempts, now=now
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
            updated = row.update(status=DeliveryStatus.DEAD, finished_at=now, last_error=error)
            if updated:
                _mark_events_handled({claimed.raw_event_id}, now)
        else:
            outcome = DeliveryAttempt.Outcome.TRANSIENT
            updated = row.update(
                status=DeliveryStatus.PENDING,
                next_attempt_at=decision.retry_at,
                claimed_at=None,
                last_error=error,
                # Released (not the delivery's fault): the attempt is given back.
                **({} if decision.charged else {"attempts": F("attempts") - 1}),
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

    The batch runs in one transaction with a savepoint per handler: a handler's writes and
    its delivery's `done` commit together, a failing handler rolls back only its own
    savepoint, and the batch pays for one commit (one WAL flush) instead of one per event.
    Should the batch fail outside a handler's savepoint — a handler's write that only fails
    at COMMIT (PostgreSQL checks Django's foreign keys there), say — it is run again one
    delivery per transaction, and a delivery that fails on its own is charged like any
    transient failure. Should our database fail, every delivery of the batch stays
    `processing` and is re-armed by deliveries_rearm_stale — handlers are idempotent, so
    running again is safe. Handlers must therefore be quick and touch only the database
    (slow work goes through an outbox), or they would hold the batch's locks.
    """
    claimed = _claim_due_deliveries(limit or settings.INBOX_BATCH_SIZE, now or timezone.now())
    if not claimed:
        return 0
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
            # The last net: the delivery stays `processing` until it is re-armed as stale.
            logger.error(
                "ingress.deliver.record_failed",
                extra={"delivery_id": failure.claimed.id, "error": type(exc).__name__},
            )
    return len(claimed)


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


def _run_claimed(claimed: list[_Claimed], events: dict[int, RawEvent]) -> list[_Failure]:
    """Run the handlers in one transaction, a savepoint each; returns the failed ones."""
    failures: list[_Failure] = []
    with transaction.atomic():
        attempts: list[DeliveryAttempt] = []
        for item in claimed:
            started = timezone.now()
            try:
                with transaction.atomic():
                    _call_handler(item, events)
            except Exception as exc:
                # eventdrop.retry.classify, the table the outbox uses too: PermanentHandlerError
                # and an unparseable body are permanent; our database's errors and anything
                # unclassified are retried (a handler only sees verified events, and a bug
                # fixed by the next deploy should not have killed the event meanwhile),
                # bounded by max_attempts; dead deliveries can be re-armed from the console.
                failures.append(_Failure(item, classify(exc), _describe(exc), started))
                continue
            attempts.append(
                DeliveryAttempt(
                    delivery_id=item.id,
                    number=item.number,
                    started_at=started,
                    finished_at=timezone.now(),
                    outcome=DeliveryAttempt.Outcome.DONE,
                )
            )
        if attempts:
            finished = timezone.now()
            Delivery.objects.filter(id__in=[a.delivery_id for a in attempts]).update(
                status=DeliveryStatus.DONE, finished_at=finished, last_error=""
            )
            DeliveryAttempt.objects.bulk_create(attempts)
            done_ids = {a.delivery_id for a in attempts}
            _mark_events_handled(
                {item.raw_event_id for item in claimed if item.id in done_ids}, finished
            )
    return failures


def _describe(exc: Exception) -> str:
    try:
        message = str(exc)
    except Exception:  # an exception whose __str__ raises must not take the batch with it
        message = "(message unprintable)"
    return f"{type(exc).__name__}: {message}"


@transaction.atomic
def deliveries_rearm_stale(*, now: datetime | None = None) -> int:
    """Deliveries left `processing` by a worker that died go back to `pending` — or `dead`.

    The claim charged the attempt (the handler may have run, and written, before the worker
    died), so a delivery whose charged attempts already reached DELIVERY_MAX_ATTEMPTS is
    given up here, visibly, with a payload-free reason and a history row. Without that, a
    handler that kills its worker (out of memory, a segfault in a C extension, a kill at the
    task timeout) would be claimed and re-armed forever: the dead decision is otherwise only
    made when a failure is *recorded*, and a dead worker records nothing. Returns how many
    deliveries were re-armed or given up.

    Known limit: our database failing mid-batch also leaves the batch `processing` (nothing
    can be written then), and the row cannot tell that from a dead worker; a delivery on its
    last allowed attempt when that happens is given up the same way (replay re-arms it).
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.DELIVERY_STALE_AFTER_SECONDS)
    stale = Delivery.objects.filter(status=DeliveryStatus.PROCESSING, claimed_at__lt=cutoff)
    max_attempts = delivery_retry_policy().max_attempts
    exhausted = list(
        stale.filter(attempts__gte=max_attempts)
        .select_for_update(skip_locked=True)
        .values_list("id", "raw_event_id", "attempts", "total_attempts", "claimed_at")
    )
    for delivery_id, raw_event_id, attempts, total, claimed_at in exhausted:
        _give_up_abandoned(
            delivery_id, raw_event_id, attempts, total, claimed_at, now, max_attempts
        )
    count = stale.filter(attempts__lt=max_attempts).update(
        status=DeliveryStatus.PENDING, claimed_at=None, next_attempt_at=now
    )
    if count:
        logger.warning("ingress.deliver.rearmed_stale", extra={"count": count})
    return count + len(exhausted)


WORKER_DIED = (
    "given up when re-armed as stale after {attempts} of {max_attempts} attempts: the worker "
    "died {died} times during this delivery, without recording an outcome"
)


def _give_up_abandoned(
    delivery_id: int,
    raw_event_id: int,
    attempts: int,
    total: int,
    claimed_at: datetime,
    now: datetime,
    max_attempts: int,
) -> None:
    # The attempts since the delivery was armed are numbered (total - attempts, total]; the
    # ones without a history row are the claims whose worker never came back.
    recorded = DeliveryAttempt.objects.filter(
        delivery_id=delivery_id, number__gt=total - attempts
    ).count()
    error = WORKER_DIED.format(
        died=attempts - recorded, attempts=attempts, max_attempts=max_attempts
    )
    Delivery.objects.filter(id=delivery_id).update(
        status=DeliveryStatus.DEAD, finished_at=now, last_error=error
    )
    DeliveryAttempt.objects.create(
        delivery_id=delivery_id,
        number=total,
        started_at=claimed_at,
        finished_at=now,
        outcome=DeliveryAttempt.Outcome.DEAD,
        error=error,
    )
    _mark_events_handled({raw_event_id}, now)
    logger.error(
        "ingress.deliver.worker_died",
        extra={"delivery_id": delivery_id, "raw_event_id": raw_event_id, "attempts": attempts},
    )


@dataclass(frozen=True)
class InboxPass:
    verified: int
    delivered: int
    rearmed: int

    @property
    def idle(self) -> bool:
        return not (self.verified or self.delivered or self.rearmed)


def inbox_run_once(*, limit: int | None = None) -> InboxPass:
    """One pass of the worker: re-arm stale, verify a batch, run a batch of deliveries."""
    rearmed = deliveries_rearm_stale()
    verified = raw_events_verify_batch(limit=limit)
    delivered = deliveries_run_due(limit=limit)
    return InboxPass(verified=verified, delivered=delivered, rearmed=rearmed)


# --- operator actions (console, API, commands) ---------------------------------------------


@transaction.atomic
def raw_event_replay(*, raw_event: RawEvent) -> int:
    """Queue the event to its handlers again. Returns how many deliveries were (re)armed.

    Handlers are idempotent, so a replay is always safe; deliveries that are running right
    now are left alone (they will finish on their own).
    """
    event = RawEvent.objects.select_for_update().get(pk=raw_event.pk)
    if event.signature_status != SignatureStatus.VERIFIED:
        raise ReplayRefused(REPLAY_NOT_VERIFIED.format(id=event.id, status=event.signature_status))
    if event.dispatch_status == DispatchStatus.DUPLICATE:
        raise ReplayRefused(REPLAY_DUPLICATE.format(id=event.id, original=event.duplicate_of_id))
    now = timezone.now()
    # Handlers registered since the event arrived are included: a replay is how an event
    # that had no handler reaches a new one.
    for spec in handlers_for(event.provider, event.event_type):
        Delivery.objects.get_or_create(
            raw_event_id=event.id, handler=spec.name, defaults={"next_attempt_at": now}
        )
    deliveries = Delivery.objects.filter(raw_event_id=event.id)
    # A delivery running right now is left to finish; it is not counted as re-armed.
    rearmed = deliveries.exclude(status=DeliveryStatus.PROCESSING).update(
        status=DeliveryStatus.PENDING,
        attempts=0,
        next_attempt_at=now,
        claimed_at=None,
        finished_at=None,
    )
    event.dispatch_status = (
        DispatchStatus.DISPATCHED if deliveries.exists() else DispatchStatus.NO_HANDLER
    )
    event.handled_at = None
    event.save(update_fields=["dispatch_status", "handled_at"])
    logger.info("ingress.replay", extra={"raw_event_id": event.id, "deliveries": rearmed})
    return rearmed


@transaction.atomic
def raw_event_reverify(*, raw_event: RawEvent) -> RawEvent:
    """Verify a rejected event again now (after a secret was fixed), and route it if it passes."""
    event = RawEvent.objects.select_for_update().get(pk=raw_event.pk)
    if event.signature_status != SignatureStatus.REJECTED:
        raise ReverifyRefused(
            REVERIFY_NOT_REJECTED.format(id=event.id, status=event.signature_status)
        )
    _settle_events([event], timezone.now())
    return event
