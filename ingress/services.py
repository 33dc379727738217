"""Writes to the raw event store and the operator's actions on it.

The receive path calls exactly one of these (raw_event_store from the Django view,
raw_event_store_async on the production server); raw_events_rotate_keys is the
encryption key rotation; raw_event_replay and raw_event_reverify are the operator actions the
console, the API and the commands call. The inbox's own writes (verify, dedup, fan out) are in
ingress/inbox.py, running deliveries in ingress/deliveries/.
"""

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from ingress.deliveries import (
    deliveries_arm_for_replay,
    deliveries_hold,
    deliveries_rearm_dead,
    deliveries_rearm_orphaned,
    deliveries_release,
)
from ingress.encryption import BodyUndecryptable, encrypt_request, keyring, reencrypt_request
from ingress.handlers import get_handler
from ingress.inbox import raw_events_settle
from ingress.models import (
    Delivery,
    DeliveryStatus,
    DispatchStatus,
    HandlerPause,
    RawEvent,
    RawEventClaim,
    RawEventClaimStatus,
    RejectionReason,
    SignatureAnswer,
    SignatureQuestion,
    SignatureStatus,
)
from ingress.sources import Source, all_sources
from ingress.store import RawEventWriter, raw_event_insert
from kernel.db import database_deadline
from kernel.errors import EventDropError
from kernel.tracing import current_traceparent

logger = logging.getLogger(__name__)

REPLAY_NOT_VERIFIED = "Event #{id} is {status}, not verified: only verified events are replayed."
REPLAY_DUPLICATE = "Event #{id} is a duplicate of #{original}: replay the original instead."
REVERIFY_NOT_REJECTED = "Event #{id} is {status}: only rejected events are re-verified."
ANSWER_NOT_QUESTIONED = (
    "Event #{id} is {status}, not questioned: only an event whose repeated signature waits "
    "for an answer is answered."
)


class ReplayRefused(EventDropError):
    pass


class ReverifyRefused(EventDropError):
    pass


class AnswerRefused(EventDropError):
    pass


def raw_event_store(
    *,
    source: Source,
    method: str,
    path: str,
    query_string: str,
    headers: Mapping[str, str],
    body: bytes,
    remote_addr: str | None,
) -> RawEvent:
    """Persist one received request, exactly as received, and return it once committed:
    the group commit's INSERT, for one row, on this thread's connection (the Django view;
    tests, commands).

    Everything here ends within WEBHOOK_STORE_TIMEOUT_SECONDS (kernel.db): opening a
    connection if this thread has none, the INSERT, and one retry when the server dropped the
    connection under it. Past it, or on any other database error, DatabaseError propagates
    and nothing may be acknowledged.
    """
    fields = _raw_event_fields(
        source, method, path, query_string, headers, body, remote_addr, current_traceparent()
    )
    with database_deadline(settings.WEBHOOK_STORE_TIMEOUT_SECONDS):
        try:
            return raw_event_insert(fields)
        except (OperationalError, InterfaceError):
            # Lost, not refused or timed out, and not inside a caller's transaction (a new
            # connection would silently lose the statements before this one): a restart the
            # health check did not see yet. If the first INSERT did commit before the
            # connection died, the event is stored twice; the inbox's dedup key makes the
            # copy a `duplicate`.
            if not getattr(connection.connection, "broken", False) or connection.in_atomic_block:
                raise
            connection.close()
            return raw_event_insert(fields)


async def raw_event_store_async(
    writer: RawEventWriter,
    *,
    seconds: float,
    source: Source,
    method: str,
    path: str,
    query_string: str,
    headers: Mapping[str, str],
    body: bytes,
    remote_addr: str | None,
    traceparent: str,
) -> int:
    """raw_event_store on the production server's event loop (ingress/asgi.py): the same
    row and the same promises, written on `writer`'s asyncio connections, within `seconds`
    (WEBHOOK_STORE_TIMEOUT_SECONDS, or less: what the request's budget leaves); its id.
    `traceparent`: the receive span's, passed (an unsampled one is not made current)."""
    fields = _raw_event_fields(
        source, method, path, query_string, headers, body, remote_addr, traceparent
    )
    return await writer.insert(fields, seconds=seconds)


def _raw_event_fields(
    source: Source,
    method: str,
    path: str,
    query_string: str,
    headers: Mapping[str, str],
    body: bytes,
    remote_addr: str | None,
    traceparent: str,
) -> dict[str, object]:
    delivery_id = headers.get(source.delivery_id_header, "") if source.delivery_id_header else ""
    # Encrypted here, in Python, before the one INSERT (when RAW_EVENT_ENCRYPTION_KEYS is
    # set); the hash is of the plaintext. Cost per request: docs/benchmarks.md.
    stored_body, stored_headers, body_encryption = encrypt_request(body, dict(headers))
    return {
        "source": source.name,
        "provider": source.provider,
        "method": method,
        "path": path,
        "query_string": query_string,
        "headers": stored_headers,
        "body": stored_body,
        "body_encryption": body_encryption,
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "remote_addr": remote_addr,
        "delivery_id": delivery_id[:255],
        "received_at": timezone.now(),
        # The receive span's (kernel/tracing.py); "" when tracing is off.
        "traceparent": traceparent,
    }


@dataclass(frozen=True)
class KeyRotation:
    rewritten: int  # bodies written again under the first entry of the keys
    undecryptable: int  # bodies none of the configured keys could read (left as they are)
    batches: int


def raw_events_rotate_keys(*, batch_size: int = 500, max_batches: int | None = None) -> KeyRotation:
    """Rewrite every body not stored as RAW_EVENT_ENCRYPTION_KEYS' first entry says.

    Under the first key (a rotation, or encrypting what was stored before encryption was on),
    or as plaintext when the first entry is `plaintext` (turning encryption off). Walks the
    store in (received_at, id) order, `batch_size` rows per short transaction of its own, so
    webhooks and the inbox go on meanwhile; each row's lock wait is capped by the statement
    timeout. Safe to stop and run again: what is done is done. A body no key can read is
    counted and left alone (a key missing from the list, or a damaged row).
    """
    ring = keyring()
    cursor: tuple | None = None
    rewritten = undecryptable = batches = 0
    while max_batches is None or batches < max_batches:
        with transaction.atomic():
            rows = RawEvent.objects.select_for_update().exclude(body_encryption=ring.primary_id)
            if cursor is not None:
                rows = rows.filter(
                    Q(received_at__gt=cursor[0]) | Q(received_at=cursor[0], id__gt=cursor[1])
                )
            batch = list(
                rows.order_by("received_at", "id").only(
                    "id", "received_at", "body", "headers", "body_encryption"
                )[:batch_size]
            )
            if not batch:
                break
            batches += 1
            cursor = (batch[-1].received_at, batch[-1].id)
            updates = []
            for event in batch:
                try:
                    body, headers, scheme = reencrypt_request(
                        bytes(event.body), event.headers, event.body_encryption
                    )
                except BodyUndecryptable:
                    undecryptable += 1
                    continue
                updates.append((body, headers, scheme, event))
            _write_bodies(updates)
            rewritten += len(updates)
    logger.info(
        "ingress.raw_event_keys.rotated",
        extra={"rewritten": rewritten, "undecryptable": undecryptable, "batches": batches},
    )
    return KeyRotation(rewritten=rewritten, undecryptable=undecryptable, batches=batches)


def _write_bodies(updates: list[tuple[bytes, dict, str, RawEvent]]) -> None:
    # One pipelined executemany; `received_at` in the WHERE prunes to the day's partition.
    ops = connection.ops
    table = ops.quote_name(RawEvent._meta.db_table)
    sql = (
        f"UPDATE {table} SET body = %s, headers = %s::jsonb, body_encryption = %s "  # noqa: S608
        "WHERE id = %s AND received_at = %s"
    )
    rows = [
        (
            body,
            json.dumps(headers),
            scheme,
            event.id,
            ops.adapt_datetimefield_value(event.received_at),
        )
        for body, headers, scheme, event in updates
    ]
    if rows:
        with connection.cursor() as cursor:
            cursor.executemany(sql, rows)


# --- operator actions (console, API, commands) ---------------------------------------------


@dataclass(frozen=True)
class ReplayCounts:
    """What one call of raw_events_replay_batch did, for the operator's record and a job's
    progress. Every requested id lands in exactly one of replayed, nothing_to_arm, refused
    and not_found."""

    requested: int
    replayed: int  # events with at least one delivery (re)armed
    nothing_to_arm: int  # verified events whose deliveries were all already queued or kept
    not_found: int  # ids with no raw event (dropped past retention, or never existed)
    deliveries_armed: int  # deliveries (re)armed, new ones for new handlers included
    already_queued: int  # deliveries left as they were: running (or held by a pause)
    superseded_kept: int  # superseded deliveries left alone (replay them with force=True)
    refused: dict[int, str] = field(default_factory=dict)  # raw event id -> why


def raw_events_replay_batch(*, raw_event_ids: Sequence[int], force: bool = False) -> ReplayCounts:
    """Queue these raw events to their handlers again, in one transaction. Set-based: a few
    statements for the whole batch, whose size the caller bounds (a console job's batch).

    Only verified originals are replayed: a rejected or pending event, or a duplicate, is
    refused with the reason. Handlers registered since an event arrived get a delivery: a
    replay is how an event that had no handler reaches a new one. Idempotent: an event
    keeps one delivery per handler (the unique index), so a re-run re-arms the same rows
    and never queues a second one. `force` also re-arms deliveries superseded by a newer
    event of their ordering key, and runs them despite it (ingress/deliveries/).
    """
    ids = sorted(set(raw_event_ids))
    now = timezone.now()
    refused: dict[int, str] = {}
    with transaction.atomic():
        # Locked, in id order, so two replays (or a replay and the inbox's settle of the
        # same rows) never deadlock; only the columns decided on, not the bodies.
        events = list(
            RawEvent.objects.select_for_update()
            .filter(id__in=ids)
            .order_by("id")
            .only(*_REPLAY_FIELDS)
        )
        replayable: list[RawEvent] = []
        for event in events:
            if event.signature_status != SignatureStatus.VERIFIED:
                refused[event.id] = REPLAY_NOT_VERIFIED.format(
                    id=event.id, status=event.signature_status
                )
            elif event.dispatch_status == DispatchStatus.DUPLICATE:
                refused[event.id] = REPLAY_DUPLICATE.format(
                    id=event.id, original=event.duplicate_of_id
                )
            else:
                replayable.append(event)
        arming = deliveries_arm_for_replay(replayable, force=force, now=now)
        with_deliveries = set(
            Delivery.objects.filter(raw_event_id__in=[e.id for e in replayable])
            .values_list("raw_event_id", flat=True)
            .distinct()
        )
        if replayable:
            RawEvent.objects.filter(id__in=with_deliveries).update(
                dispatch_status=DispatchStatus.DISPATCHED, handled_at=None
            )
            RawEvent.objects.filter(
                id__in=[e.id for e in replayable if e.id not in with_deliveries]
            ).update(dispatch_status=DispatchStatus.NO_HANDLER, handled_at=None)
    replayed = sum(1 for e in replayable if arming.armed_by_event.get(e.id))
    counts = ReplayCounts(
        requested=len(ids),
        replayed=replayed,
        nothing_to_arm=len(replayable) - replayed,
        not_found=len(ids) - len(events),
        deliveries_armed=sum(arming.armed_by_event.values()),
        already_queued=arming.already_queued,
        superseded_kept=arming.superseded_kept,
        refused=refused,
    )
    logger.info(
        "ingress.replay.batch",
        extra={
            "requested": counts.requested,
            "replayed": counts.replayed,
            "deliveries": counts.deliveries_armed,
            "refused": len(refused),
            "not_found": counts.not_found,
            "force": force,
        },
    )
    return counts


_REPLAY_FIELDS = (
    "id",
    "received_at",
    "source",
    "provider",
    "event_type",
    "signature_status",
    "dispatch_status",
    "duplicate_of_id",
    "body_encryption",
)


def raw_event_replay(*, raw_event: RawEvent) -> int:
    """Queue one event to its handlers again (raw_events_replay_batch of one). Returns how
    many deliveries were (re)armed; raises ReplayRefused with the reason if it cannot be."""
    counts = raw_events_replay_batch(raw_event_ids=[raw_event.pk])
    if counts.not_found:
        raise RawEvent.DoesNotExist(f"raw event #{raw_event.pk} does not exist")
    if counts.refused:
        raise ReplayRefused(counts.refused[raw_event.pk])
    logger.info(
        "ingress.replay",
        extra={"raw_event_id": raw_event.pk, "deliveries": counts.deliveries_armed},
    )
    return counts.deliveries_armed


@dataclass(frozen=True)
class RearmCounts:
    requested: int
    rearmed: int  # dead ones armed afresh, and claims of workers that are gone taken back
    not_dead: int  # ids neither dead nor orphaned (already re-armed, done, gone, running)
    running: int = 0  # of those, `processing` under a worker that lives: left to it


def deliveries_rearm_batch(*, delivery_ids: Sequence[int]) -> RearmCounts:
    """Dead deliveries back to `pending` with their attempts reset, and `processing` ones
    whose worker is gone taken back (kernel/queue.py: due now, the death counted), in one
    transaction each.

    A delivery a live worker runs is left to it; anything else is counted and left alone,
    so a re-run of the same ids re-arms nothing twice. The history (DeliveryAttempt) is kept
    and goes on numbering from total_attempts.
    """
    ids = sorted(set(delivery_ids))
    now = timezone.now()
    with transaction.atomic():
        rearmed = deliveries_rearm_dead(ids, now=now)
    orphaned = deliveries_rearm_orphaned(now=now, ids=ids)
    running = Delivery.objects.filter(id__in=ids, status=DeliveryStatus.PROCESSING).count()
    total = rearmed + orphaned
    logger.info(
        "ingress.deliveries.rearmed",
        extra={"requested": len(ids), "rearmed": rearmed, "orphaned": orphaned},
    )
    return RearmCounts(
        requested=len(ids), rearmed=total, not_dead=len(ids) - total, running=running
    )


@transaction.atomic
def raw_event_reverify(*, raw_event: RawEvent) -> RawEvent:
    """Verify a rejected event again now (after a secret was fixed), and route it if it passes."""
    event = RawEvent.objects.select_for_update().get(pk=raw_event.pk)
    if event.signature_status != SignatureStatus.REJECTED:
        raise ReverifyRefused(
            REVERIFY_NOT_REJECTED.format(id=event.id, status=event.signature_status)
        )
    if event.rejection_reason == RejectionReason.WORKER_DIED:
        # Settling it killed its worker again and again: not settled here, in the caller's
        # process (a console web worker), but handed back to the inbox worker, pending — as
        # a suspect (one death counted), so that it is claimed alone and, should it still
        # kill, set aside again after INBOX_MAX_WORKER_DEATHS.
        handed_back = {
            "signature_status": SignatureStatus.PENDING,
            "rejection_reason": "",
            "dispatch_status": DispatchStatus.WAITING,
            "processing_error": "",
            "retry_not_before": None,
        }
        RawEvent.objects.filter(id=event.id, received_at=event.received_at).update(**handed_back)
        RawEventClaim.objects.update_or_create(
            raw_event_id=event.id,
            defaults={
                "status": RawEventClaimStatus.PENDING,
                "claimed_at": None,
                "claimed_by": None,
                "worker_deaths": 1,
            },
        )
        for name, value in handed_back.items():
            setattr(event, name, value)
        return event
    raw_events_settle([event], timezone.now())
    return event


def signature_question_answer(
    *, raw_event_id: int, genuine: bool, answered_by: str, evidence: str
) -> RawEvent:
    """Answer a questioned event's signature question and act on the answer, in one
    transaction (ingress/signature_replays.py). Genuine: the event is handed back to the
    inbox, `pending`, whose settle verifies it, deduplicates it on its delivery id and runs
    its handlers as for any event (in the process that runs handlers, under its claim). A
    replay: it is settled here, rejected `replayed_signature`.

    Fenced: the event is locked and must still be `questioned`, so two answers (a scheduled
    run and an operator, two hosts) settle it once; the later one is refused (AnswerRefused).
    `answered_by`: "github" or the operator's username; `evidence`: what decided it.
    """
    now = timezone.now()
    with transaction.atomic():
        question = SignatureQuestion.objects.filter(raw_event_id=raw_event_id).first()
        # Locked before its question, as the inbox's settle locks events first.
        event = (
            RawEvent.objects.select_for_update()
            .filter(id=raw_event_id, **_partition_of(question))
            .first()
        )
        if event is None:
            raise RawEvent.DoesNotExist(f"raw event #{raw_event_id} does not exist")
        answered = (
            question is not None
            and event.signature_status == SignatureStatus.QUESTIONED
            and SignatureQuestion.objects.filter(
                pk=question.pk, answer=SignatureAnswer.OPEN
            ).update(
                answer=SignatureAnswer.GENUINE if genuine else SignatureAnswer.REPLAYED,
                answered_at=now,
                answered_by=answered_by[:150],
                evidence=evidence,
                checked_at=now,
            )
        )
        if not answered:
            raise AnswerRefused(
                ANSWER_NOT_QUESTIONED.format(id=event.id, status=event.signature_status)
            )
        if genuine:
            RawEvent.objects.filter(id=event.id, received_at=event.received_at).update(
                signature_status=SignatureStatus.PENDING, retry_not_before=None
            )
            event.signature_status = SignatureStatus.PENDING
        else:
            raw_events_settle([event], now)
    logger.info(
        "ingress.signature_question.answered",
        extra={
            "raw_event_id": event.id,
            "source": event.source,
            "genuine": genuine,
            "answered_by": answered_by,
            "signature_status": event.signature_status,
            "dispatch_status": event.dispatch_status,
        },
    )
    return event


def _partition_of(question: SignatureQuestion | None) -> dict[str, object]:
    # The event's received_at, when known, prunes the lookup to its day's partition.
    return {"received_at": question.received_at} if question is not None else {}


# --- pause and resume ----------------------------------------------------------------------

PAUSE_NEEDS_ONE_SCOPE = "Pause one handler or one source, not {given}."
PAUSE_UNKNOWN_HANDLER = "No handler named {name!r} is registered."
PAUSE_UNKNOWN_SOURCE = "No source named {name!r} is configured."
PAUSE_ALREADY = "The {scope} is already paused (since {since:%Y-%m-%d %H:%M:%S} UTC)."
RESUME_NOT_PAUSED = "The {scope} is not paused."
RESUME_NO_RATE = "INBOX_RESUME_RELEASE_PER_SECOND is {rate}: set it above 0 to resume."


class PauseRefused(EventDropError):
    pass


@dataclass(frozen=True)
class PauseChange:
    pause: HandlerPause
    deliveries: int  # held by the pause / released by the resume
    release_seconds: float = 0.0  # resume: how long the release of the backlog is spread over


def handler_pause(*, handler: str = "", source: str = "") -> PauseChange:
    """Pause one handler (by its registered name) or every handler of one source.

    Events keep being received, stored, verified and deduplicated; the deliveries the pause
    covers are `held`: the pending ones now, and any that comes due while it lasts (a new
    event, a retry, a replay), before its attempt is charged. Deliveries already running
    finish. Refused (PauseRefused) for an unknown name or a scope already paused.
    """
    scope = _pause_scope(handler=handler, source=source)
    with transaction.atomic():
        active = HandlerPause.objects.filter(
            handler=handler, source=source, resumed_at__isnull=True
        ).first()
        if active is not None:
            raise PauseRefused(PAUSE_ALREADY.format(scope=scope, since=active.paused_at))
        pause = HandlerPause.objects.create(handler=handler, source=source)
        held = deliveries_hold(handler=handler, source=source)
    logger.info("ingress.pause", extra={"handler": handler, "source": source, "held": held})
    return PauseChange(pause=pause, deliveries=held)


def handler_resume(*, handler: str = "", source: str = "") -> PauseChange:
    """End the pause of this handler or source and release what it held: back to `pending`
    in received order, INBOX_RESUME_RELEASE_PER_SECOND of them per second (see settings).
    Deliveries that another active pause still covers are held again when they come due."""
    scope = _pause_scope(handler=handler, source=source, known=False)
    per_second = settings.INBOX_RESUME_RELEASE_PER_SECOND
    if not per_second > 0:  # NaN too: a release at no rate would never end
        raise PauseRefused(RESUME_NO_RATE.format(rate=per_second))
    with transaction.atomic():
        pause = (
            HandlerPause.objects.select_for_update()
            .filter(handler=handler, source=source, resumed_at__isnull=True)
            .first()
        )
        if pause is None:
            raise PauseRefused(RESUME_NOT_PAUSED.format(scope=scope))
        now = timezone.now()
        released = deliveries_release(
            handler=handler, source=source, now=now, per_second=per_second
        )
        pause.resumed_at = now
        pause.released = released
        pause.save(update_fields=["resumed_at", "released"])
    logger.info(
        "ingress.resume", extra={"handler": handler, "source": source, "released": released}
    )
    return PauseChange(pause=pause, deliveries=released, release_seconds=released / per_second)


def _pause_scope(*, handler: str, source: str, known: bool = True) -> str:
    if bool(handler) == bool(source):
        given = "both" if handler else "neither"
        raise PauseRefused(PAUSE_NEEDS_ONE_SCOPE.format(given=given))
    # A resume needs no registered name: a handler removed while paused can still be resumed.
    if known and handler and get_handler(handler) is None:
        raise PauseRefused(PAUSE_UNKNOWN_HANDLER.format(name=handler))
    if known and source and source not in all_sources():
        raise PauseRefused(PAUSE_UNKNOWN_SOURCE.format(name=source))
    return f"handler {handler}" if handler else f"source {source}"
