"""Run due deliveries: claim a batch on the one queue (kernel/queue.py), run it in one
transaction, record each failure as kernel/retry.py decides (docs/flows.md, "Deliveries").

The batch's transaction first locks its claims (fenced), so a row re-armed and claimed by
another worker meanwhile is not run, and a row this batch holds is never re-armed under it.
No savepoint per handler unless one raises: then the batch is rolled back and run again a
savepoint each, so that only the failing handler is charged. Should our database fail, the
batch's claims are given back (owed until the database answers).
"""

import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from ingress.deliveries.holds import hold_claimed_paused
from ingress.deliveries.ordering import heads_within_shares, key_heads_to_claim, suspects_alone
from ingress.deliveries.pace import handler_slow_down, paces_lock, slows_down
from ingress.encryption import keyring
from ingress.handlers import PermanentHandlerError, get_handler, handler_note
from ingress.models import (
    UNFINISHED_DELIVERY_STATUSES,
    Delivery,
    DeliveryAttempt,
    DeliveryClaim,
    DeliveryStatus,
    RawEvent,
)
from ingress.payloads import parse_payload, raw_event_body, raw_event_headers, storable_text
from kernel import tracing
from kernel.errors import Disposition
from kernel.queue import DATABASE_UNAVAILABLE, Holder
from kernel.retry import Action, Failure, RetryPolicy, RetryStrategy, classify

logger = logging.getLogger("ingress.deliveries")

HANDLER_MISSING = "handler {name} is no longer registered"
# A delivery's last_error when its worker died too often with it (PostgreSQL's format(): %s
# is the count).
DELIVERY_WORKER_DIED_ERROR = (
    "worker_died: its worker died %s times in a row running it (killed, out of memory, a "
    "crash); re-arm it once the cause is fixed"
)
# How long a delivery whose body we cannot decrypt waits before it is claimed again.
KEY_MISSING_RECHECK_SECONDS = 60


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


@dataclass(frozen=True)
class HandlerFailure:
    claim: DeliveryClaim
    failure: Failure  # kernel.retry.classify: the one classification table
    error: str
    started: datetime


# --- the claim -------------------------------------------------------------------------------


def deliveries_claim(
    *, limit: int, now: datetime, holder: Holder | None = None
) -> list[DeliveryClaim]:
    """The one place deliveries are claimed, in one short transaction: up to `limit` due
    unordered deliveries (the one queue's claim, in turns across the handlers) and up to
    `limit` heads of ordering keys, each handler within what its pace leaves (pace.py). What
    a pause covers is held instead, its attempt given back, before anything runs."""
    queue = Delivery.objects
    with transaction.atomic():
        paces = paces_lock(now=now, limit=limit)
        claims = hold_claimed_paused(
            queue.claim(
                limit=limit,
                now=now,
                eligible="ordering_key = ''",
                holder=holder,
                shares=paces.shares,
            )
        )
        heads = key_heads_to_claim(limit, now)
        chosen = suspects_alone(
            heads.claimable,
            beside_suspect=any(claim.worker_deaths > 0 for claim in claims),
            beside_any=bool(claims),
        )
        chosen = heads_within_shares(chosen, paces.shares, taken=_per_handler(claims))
        claims += queue.claim_ids([head.id for head in chosen], now=now, holder=holder)
        if paces.rows:
            paces.spend(_per_handler(claims))
    if heads.superseded:
        # After the claim's commit: the claim locks no raw event, so it can never be one half
        # of a deadlock with a replay (which locks the events, then their deliveries).
        mark_events_handled(heads.superseded, now)
    return cast(list[DeliveryClaim], claims)


def _per_handler(claims: list) -> dict[str, int]:
    return dict(Counter(cast(DeliveryClaim, claim).handler for claim in claims))


def mark_events_handled(
    raw_event_ids: set[int], now: datetime, *, received: list[datetime] | None = None
) -> None:
    """Stamp handled_at on events whose deliveries have all finished (done or dead).
    `received`: the events' received_at when the caller has them, so that the UPDATE reads
    only their day partitions (an id alone prunes none)."""
    unfinished = Delivery.objects.filter(
        raw_event_id=OuterRef("id"), status__in=UNFINISHED_DELIVERY_STATUSES
    )
    rows = RawEvent.objects.filter(id__in=raw_event_ids, handled_at__isnull=True)
    if received:
        rows = rows.filter(received_at__range=(min(received), max(received)))
    rows.exclude(Exists(unfinished)).update(handled_at=now)


# --- the run -------------------------------------------------------------------------------


def deliveries_run_due(*, limit: int | None = None, now: datetime | None = None) -> int:
    """Claim and run up to `limit` due deliveries. Returns how many were run.

    Handlers must be quick and touch only the database (slow work goes through an outbox):
    the batch's transaction holds its rows' locks while they run.
    """
    _give_back_owed()
    claims = deliveries_claim(limit=limit or settings.INBOX_BATCH_SIZE, now=now or timezone.now())
    if not claims:
        return 0
    try:
        return _run_and_record(claims)
    except BaseException:
        # Not finished, and this worker lives: given back (fenced: what was recorded stays),
        # or owed until our database answers.
        _give_back(claims)
        raise


def _give_back(claims: list[DeliveryClaim]) -> None:
    given = Delivery.objects.give_back_or_owe(claims)
    if given:
        logger.warning("ingress.deliver.claims_given_back", extra={"deliveries": given})


def _give_back_owed() -> int:
    """Give back the claims this process owes (kernel/queue.py): raises while our database is
    unavailable, and they stay owed."""
    given = Delivery.objects.pay_owed()
    if given:
        logger.warning("ingress.deliver.claims_given_back", extra={"deliveries": given})
    return given


def _run_and_record(claims: list[DeliveryClaim]) -> int:
    """Run the claimed batch and record its failures; returns how many ran."""
    events = RawEvent.objects.in_bulk({claim.raw_event_id for claim in claims})
    claims = _release_unreadable(claims, events)
    try:
        failures = _run_claimed(claims, events)
    except DATABASE_UNAVAILABLE:
        raise
    except Exception as exc:
        # The batch failed outside a handler's savepoint (a write checked only at COMMIT, say):
        # run again one delivery per transaction; one that fails on its own is charged.
        logger.warning(
            "ingress.deliver.batch_failed",
            extra={"deliveries": len(claims), "error": type(exc).__name__},
        )
        failures = []
        for claim in claims:
            started = timezone.now()
            try:
                failures += _run_claimed([claim], events)
            except DATABASE_UNAVAILABLE:
                raise
            except Exception as exc:
                failures.append(HandlerFailure(claim, classify(exc), _describe(exc), started))
    for failure in failures:
        try:
            record_failure(failure)
        except DATABASE_UNAVAILABLE:
            raise
        except Exception as exc:
            # The last net: the claim is given back, uncharged (the worker lives: no death).
            logger.error(
                "ingress.deliver.record_failed",
                extra={"delivery_id": failure.claim.id, "error": type(exc).__name__},
            )
            _give_back([failure.claim])
    return len(claims)


def _release_unreadable(
    claims: list[DeliveryClaim], events: dict[int, RawEvent]
) -> list[DeliveryClaim]:
    """Deliveries whose event's body is under a key RAW_EVENT_ENCRYPTION_KEYS no longer holds
    go back to `pending`, uncharged: our configuration, not the delivery's fault. Returns the
    others."""
    known = keyring().known_ids
    unreadable = {
        claim.id
        for claim in claims
        if (event := events.get(claim.raw_event_id)) is not None
        and event.body_encryption not in known
    }
    if not unreadable:
        return claims
    Delivery.objects.filter(id__in=unreadable, status=DeliveryStatus.PROCESSING).update(
        status=DeliveryStatus.PENDING,
        claimed_at=None,
        claimed_by=None,
        attempts=F("attempts") - 1,
        total_attempts=F("total_attempts") - 1,
        next_attempt_at=timezone.now() + timedelta(seconds=KEY_MISSING_RECHECK_SECONDS),
    )
    logger.warning("ingress.deliver.encryption_key_missing", extra={"deliveries": len(unreadable)})
    return [claim for claim in claims if claim.id not in unreadable]


class _HandlerRaised(Exception):
    """A handler of the optimistic pass raised: its batch is rolled back and run isolated."""

    def __init__(self, failure: HandlerFailure, exc: Exception):
        super().__init__(failure.error)
        self.failure = failure
        self.exc = exc


def _run_claimed(claims: list[DeliveryClaim], events: dict[int, RawEvent]) -> list[HandlerFailure]:
    """Run the handlers in one transaction; returns the failed ones. Optimistically first,
    without a savepoint per handler (two round trips a delivery for nothing on the usual
    path); should one raise, again a savepoint each."""
    try:
        return _run_claimed_batch(claims, events, isolated=False)
    except _HandlerRaised as raised:
        cause = raised.exc
        if isinstance(cause, DATABASE_UNAVAILABLE) and connection.connection is None:
            # The rollback failed too and Django closed the connection: our database is down,
            # not a handler's fault; not run a second time against a reconnect.
            raise cause from None
        logger.info(
            "ingress.deliver.batch_isolated",
            extra={"deliveries": len(claims), "error": type(cause).__name__},
        )
        # The handler's own exception is charged as raised, not called twice for the same
        # attempt; a database error is no proof (an earlier handler may have swallowed one),
        # so that handler runs again in its savepoint.
        known = None if isinstance(cause, DatabaseError) else raised.failure
    return _run_claimed_batch(claims, events, isolated=True, known=known)


def _run_claimed_batch(
    claims: list[DeliveryClaim],
    events: dict[int, RawEvent],
    *,
    isolated: bool,
    known: HandlerFailure | None = None,
) -> list[HandlerFailure]:
    failures: list[HandlerFailure] = []
    queue = Delivery.objects
    with transaction.atomic():
        held = queue.lock(claims)
        for claim in claims:
            if claim.id not in held:
                logger.warning(
                    "ingress.deliver.lost_claim",
                    extra={"delivery_id": claim.id, "attempt": claim.attempts},
                )
        claims = [claim for claim in claims if claim.id in held]
        attempts: list[DeliveryAttempt] = []
        for claim in claims:
            if known is not None and claim.id == known.claim.id:
                failures.append(known)
                continue
            started = timezone.now()
            try:
                if isolated:
                    with transaction.atomic():
                        note = _call_handler(claim, events)
                else:
                    note = _call_handler(claim, events)
            except Exception as exc:
                failure = HandlerFailure(claim, classify(exc), _describe(exc), started)
                if not isolated:
                    raise _HandlerRaised(failure, exc) from exc
                failures.append(failure)
                continue
            attempts.append(
                DeliveryAttempt(
                    delivery_id=claim.id,
                    number=claim.number,
                    started_at=started,
                    finished_at=timezone.now(),
                    outcome=DeliveryAttempt.Outcome.DONE,
                    note=note,
                )
            )
        if attempts:
            finished = timezone.now()
            done_ids = {attempt.delivery_id for attempt in attempts}
            done = [claim for claim in claims if claim.id in done_ids]
            marked = queue.complete(done, now=finished)
            if marked != len(done):
                # Each row is locked by this transaction as our claim: a miss is a bug.
                raise RuntimeError(f"marked {marked} of {len(done)} deliveries done")
            DeliveryAttempt.objects.bulk_create(attempts)
            done_events = {claim.raw_event_id for claim in done}
            # A delivery is done only if its event was read (_call_handler), so all are here.
            received = [events[n].received_at for n in done_events]
            mark_events_handled(done_events, finished, received=received)
    return failures


def _call_handler(claim: DeliveryClaim, events: dict[int, RawEvent]) -> str:
    """Run the delivery's handler; returns its note ("" for none)."""
    event = events.get(claim.raw_event_id)
    if event is None:
        raise PermanentHandlerError(f"raw event #{claim.raw_event_id} no longer exists")
    spec = get_handler(claim.handler)
    if spec is None:
        raise PermanentHandlerError(HANDLER_MISSING.format(name=claim.handler))
    # Each attempt a span under the delivery's stored context: retries are follow-up spans
    # of the webhook's trace, whichever worker runs them and however late.
    with tracing.span(
        "webhook deliver",
        parent=claim.traceparent,
        attributes={"eventdrop.handler": claim.handler, "eventdrop.attempt": claim.number},
    ):
        payload = parse_payload(raw_event_headers(event), raw_event_body(event))
        return handler_note(spec.func(event, payload))


def _describe(exc: Exception) -> str:
    try:
        message = str(exc)
    except Exception:  # an exception whose __str__ raises must not take the batch with it
        message = "(message unprintable)"
    return f"{type(exc).__name__}: {message}"


def record_failure(failure: HandlerFailure) -> None:
    claim = failure.claim
    # A handler's message may hold a NUL or a lone surrogate: recording it must not fail.
    error = storable_text(failure.error)[:4000]
    now = timezone.now()
    decision = delivery_retry_strategy().decide(
        failure.failure,
        attempts=claim.attempts,
        now=now,
        first_failed_at=claim.first_failed_at,
        waiting_since=claim.waiting_since,
    )
    if decision.action == Action.GIVE_UP:
        permanent = failure.failure.disposition == Disposition.PERMANENT
        outcome = DeliveryAttempt.Outcome.PERMANENT if permanent else DeliveryAttempt.Outcome.DEAD
    elif decision.action == Action.RETRY:
        outcome = DeliveryAttempt.Outcome.TRANSIENT
    else:
        outcome = DeliveryAttempt.Outcome.RELEASED  # our database: not the delivery's attempt
    with transaction.atomic():
        if not Delivery.objects.record(claim, decision, error=error, now=now):
            logger.warning("ingress.deliver.lost_claim", extra={"delivery_id": claim.id})
            return
        if slows_down(failure.failure):
            handler_slow_down(handler=claim.handler, failure=failure.failure, now=now)
        if decision.action == Action.GIVE_UP:
            mark_events_handled({claim.raw_event_id}, now)
        DeliveryAttempt.objects.create(
            delivery_id=claim.id,
            number=claim.number,
            started_at=failure.started,
            finished_at=now,
            outcome=outcome,
            error=error,
        )
    logger.warning(
        "ingress.deliver.failed",
        extra={
            "delivery_id": claim.id,
            "raw_event_id": claim.raw_event_id,
            "handler": claim.handler,
            "attempt": claim.attempts,
            "outcome": outcome,
        },
    )


# --- claims of the dead --------------------------------------------------------------------


def deliveries_rearm_orphaned(*, now: datetime | None = None, ids: list[int] | None = None) -> int:
    """Deliveries whose claim's holder is gone (its worker died, its region was lost) go back
    to `pending`, the attempt given back, in one statement (kernel/queue.py); the death is
    counted, and a delivery whose worker died INBOX_MAX_WORKER_DEATHS times in a row with it
    is `dead` (`worker_died`). A claim of another region's holder is taken back uncounted.
    DELIVERY_STALE_AFTER_SECONDS is the backstop. `ids`: only these (an operator's re-arm).
    Returns how many."""
    now = now or timezone.now()
    with transaction.atomic():
        orphans = Delivery.objects.rearm_orphaned(
            now=now,
            backstop_seconds=settings.DELIVERY_STALE_AFTER_SECONDS,
            max_deaths=settings.INBOX_MAX_WORKER_DEATHS,
            error=DELIVERY_WORKER_DIED_ERROR,
            ids=ids,
        )
        dead = [orphan for orphan in orphans if orphan.status == DeliveryStatus.DEAD]
        if dead:
            DeliveryAttempt.objects.bulk_create(
                DeliveryAttempt(
                    delivery_id=orphan.id,
                    number=orphan.row["total_attempts"],
                    started_at=orphan.claimed_at,
                    finished_at=now,
                    outcome=DeliveryAttempt.Outcome.DEAD,
                    error=orphan.last_error,
                )
                for orphan in dead
            )
            mark_events_handled({orphan.row["raw_event_id"] for orphan in dead}, now)
    for orphan in dead:
        logger.error(
            "ingress.deliver.worker_died",
            extra={
                "delivery_id": orphan.id,
                "raw_event_id": orphan.row["raw_event_id"],
                "handler": orphan.row["handler"],
                "deaths": orphan.worker_deaths,
            },
        )
    taken_back = sum(orphan.taken_back for orphan in orphans)
    if len(orphans) > len(dead):
        logger.warning(
            "ingress.deliver.rearmed_orphaned",
            extra={"count": len(orphans) - len(dead), "taken_back": taken_back},
        )
    return len(orphans)
