"""Every write to the recap outbox: enqueue, claim, finish, re-arm, give up, recover.

The row is the state machine (the seed's third lesson, "accepted ≠ done"):

    pending ──claim──▶ processing ──render accepted──▶ done
       ▲                   │
       │                   ├── a failure that may be about the row (charged) ──▶ pending
       │                   ├── an answer about the service or its deploy, an
       │                   │   ambiguous one, our database, the breaker open, our
       │                   │   configuration incomplete (NEVER charged) ───────▶ pending
       │                   ├── charged, 5 charged attempts and past the horizon ▶ dead
       │                   └── a verdict about this request (422) ─────────────▶ dead
       │                                                          dead ─▶ recap failed
       └──── re-arm (stale processing, operator; a lost render, same key) ─┘

That is the finality rule (kernel/retry.py, docs/outbox.md). `attempts` counts
*charged* attempts: how often a failure that can be this row's was seen. The claim charges
one before the call; an uncharged outcome, and a re-arm after the worker died, give it back.

Only `dead` writes a terminal state on the recap. Transaction boundaries: the claim is one
statement, the network call happens outside any transaction, and each outcome — a render
accepted as much as a failure — is recorded in a transaction of its own that is fenced on
(claimed_at, attempts), so a worker that comes back after its row was re-armed and claimed
again cannot overwrite the new run. Staleness has one source of truth: `claimed_at`.
"""

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from kernel.errors import Disposition
from kernel.queue import holders_prune
from kernel.retry import Action, Failure, RetryDecision, RetryPolicy, RetryStrategy
from kernel.tracing import current_traceparent
from outbox.errors import (
    SIDE_EFFECT_ALREADY_DEAD,
    SIDE_EFFECT_ALREADY_DONE,
    SIDE_EFFECT_IN_FLIGHT,
    SIDE_EFFECT_REASON_REQUIRED,
    OutboxError,
    RenderCallbackBeforePayment,
)
from outbox.models import (
    AttemptOutcome,
    EffectType,
    RecapSideEffect,
    RecapSideEffectAttempt,
    SideEffectClaim,
    SideEffectStatus,
    WaitReason,
)
from outbox.render_client import RenderStatus
from recaps.errors import (
    RECAP_NOT_RETRYABLE,
    RECAP_RENDER_ALREADY_REQUESTED,
    RECAP_RENDER_IN_FLIGHT,
    RecapStateConflict,
)
from recaps.models import UNPAID_STATUSES, RecapId, RecapStatus, RecapVideo
from recaps.selectors import recaps_paid_without_side_effect, recaps_stuck_rendering
from recaps.services import (
    recap_lock,
    recap_lock_if_rendering,
    recap_mark_failed,
    recap_mark_ready,
    recap_mark_rendering,
    recap_render_lost,
    recap_reopen,
)

logger = logging.getLogger(__name__)

RENDER_STATUS_FAILED_REASON = "render failed (reported on a status check): {code}: {message}"
DEAD_REASON = "render request gave up after {attempts} attempt(s): {error_class}: {error}"
OPERATOR_DEAD_REASON = "marked dead by an operator: {reason}"
STALE_ERROR = (
    "re-armed: processing since {claimed_at}, its worker died (the attempt is given back: "
    "nothing proves the row killed it)"
)
RESENT_ERROR = (
    "render {render_id} is unknown to the render service (HTTP 404 on its status check): "
    "asked again with the same idempotency key"
)
STALE_CALLBACK = (
    "stale callback for render {render_id} ({kind}): the recap's current render is "
    "{current}; ignored"
)
_ERROR_LIMIT = 2000


def outbox_retry_policy() -> RetryPolicy:
    return RetryPolicy(
        max_attempts=settings.OUTBOX_MAX_ATTEMPTS,
        base_seconds=settings.OUTBOX_BACKOFF_BASE_SECONDS,
        cap_seconds=settings.OUTBOX_BACKOFF_CAP_SECONDS,
    )


def outbox_retry_strategy() -> RetryStrategy:
    return RetryStrategy(
        policy=outbox_retry_policy(), horizon_seconds=settings.OUTBOX_TRANSIENT_HORIZON_SECONDS
    )


def _history(
    side_effect_id: int,
    *,
    number: int,
    started_at: datetime,
    finished_at: datetime,
    outcome: str,
    error_class: str = "",
    error: str = "",
) -> None:
    RecapSideEffectAttempt.objects.create(
        side_effect_id=side_effect_id,
        number=number,
        started_at=started_at,
        finished_at=finished_at,
        outcome=outcome,
        error_class=error_class[:64],
        error=error[:_ERROR_LIMIT],
    )


# --- enqueue ---------------------------------------------------------------------------------


@transaction.atomic
def side_effect_enqueue(
    *, recap: RecapVideo, effect_type: str = EffectType.RENDER, now: datetime | None = None
) -> tuple[RecapSideEffect, bool]:
    """The row for (recap, effect_type), created unless it exists. Returns (row, created).

    The UNIQUE (recap, effect_type) constraint makes this idempotent even without the
    caller's lock: a concurrent second insert fails inside get_or_create's savepoint and
    reads the winner's row instead.
    """
    return RecapSideEffect.objects.get_or_create(
        recap=recap,
        effect_type=effect_type,
        # The current span (recap_mark_paid's): every dispatch attempt starts under it.
        defaults={"next_attempt_at": now or timezone.now(), "traceparent": current_traceparent()},
    )


@transaction.atomic
def side_effect_withdraw(*, recap: RecapVideo) -> bool:
    """The paid recap's payment failed before its render (recaps.signals.
    recap_payment_withdrawn): its render row goes, if no dispatcher has claimed it yet, so
    that a later payment enqueues a fresh one. A row that was claimed, done or given up on
    means the render was already requested: refused (RecapStateConflict), and the caller's
    transaction, the recap's change included, rolls back."""
    row = (
        RecapSideEffect.objects.select_for_update()
        .filter(recap=recap, effect_type=EffectType.RENDER)
        .first()
    )
    if row is None:
        return False
    if row.status != SideEffectStatus.PENDING:
        raise RecapStateConflict(RECAP_RENDER_ALREADY_REQUESTED)
    row.delete()  # its attempts' history goes with it: nothing was rendered
    logger.warning(
        "outbox.withdrawn",
        extra={"side_effect_id": row.pk, "recap_id": str(recap.pk), "attempts": row.attempts},
    )
    return True


# --- the dispatcher's side -------------------------------------------------------------------


def side_effects_claim(
    *, limit: int, now: datetime | None = None, exclude: Iterable[int] = ()
) -> list[SideEffectClaim]:
    """Claim up to `limit` due rows, due first, in one statement (the one queue's claim,
    kernel/queue.py), none of `exclude` (the rows this run tried already)."""
    claims = RecapSideEffect.objects.claim(
        limit=limit,
        now=now or timezone.now(),
        eligible="NOT (id = ANY(%(exclude)s))",
        params={"exclude": list(exclude)},
    )
    return cast(list[SideEffectClaim], claims)


def _lost_claim(claim: SideEffectClaim, started_at: datetime, now: datetime, detail: str) -> str:
    _history(
        claim.id,
        number=claim.attempts,
        started_at=started_at,
        finished_at=now,
        outcome=AttemptOutcome.LOST_CLAIM,
        error=detail,
    )
    logger.warning(
        "outbox.dispatch.lost_claim", extra={"side_effect_id": claim.id, "attempt": claim.attempts}
    )
    return AttemptOutcome.LOST_CLAIM


@transaction.atomic
def side_effect_complete(
    *, claim: SideEffectClaim, render_id: str, started_at: datetime, now: datetime | None = None
) -> str:
    """The render service accepted the render: the row is done, the recap `rendering`."""
    now = now or timezone.now()
    updated = RecapSideEffect.objects.complete(
        [claim], now=now, last_error_class="", wait_reason=WaitReason.NONE
    )
    if not updated:
        return _lost_claim(claim, started_at, now, f"accepted as render {render_id}")
    recap_mark_rendering(recap_id=claim.recap_id, render_id=render_id, now=now)
    _history(
        claim.id,
        number=claim.attempts,
        started_at=started_at,
        finished_at=now,
        outcome=AttemptOutcome.DONE,
    )
    logger.info(
        "outbox.dispatch.done",
        extra={"side_effect_id": claim.id, "recap_id": str(claim.recap_id), "render_id": render_id},
    )
    return AttemptOutcome.DONE


def _uncharged_outcome(failure: Failure) -> tuple[str, str]:
    """(history outcome, wait reason) of a failure the row is not charged for."""
    if failure.error_class == "circuit_open":
        return AttemptOutcome.SKIPPED, WaitReason.BREAKER
    if failure.error_class == "not_configured":
        return AttemptOutcome.DEFERRED, WaitReason.CONFIGURATION
    if failure.database:
        return AttemptOutcome.DATABASE, WaitReason.DATABASE
    if failure.ambiguous:
        return AttemptOutcome.AMBIGUOUS, WaitReason.AMBIGUOUS
    return AttemptOutcome.SERVICE_UNAVAILABLE, WaitReason.BREAKER


@transaction.atomic
def side_effect_fail(
    *,
    claim: SideEffectClaim,
    failure: Failure,
    error: str,
    started_at: datetime,
    now: datetime | None = None,
    release_at: datetime | None = None,
) -> str:
    """Record a failed attempt as kernel.retry.RetryStrategy decides it (the finality
    rule): a failure that is not about the row is released, the attempt given back, and
    the row waits until `release_at` (the breaker's cool-down) or its release backoff; a
    verdict kills it; a failure that may be about it is charged, and kills it only after
    its charged attempts *and* its horizon."""
    now = now or timezone.now()
    decision: RetryDecision = outbox_retry_strategy().decide(
        failure,
        attempts=claim.attempts,
        now=now,
        first_failed_at=claim.first_failed_at,
        waiting_since=claim.waiting_since,
        release_at=release_at,
    )
    queue = RecapSideEffect.objects
    recorded = error[:_ERROR_LIMIT]
    if decision.action == Action.RELEASE:
        outcome, wait_reason = _uncharged_outcome(failure)
    elif decision.action == Action.RETRY:
        outcome, wait_reason = AttemptOutcome.TRANSIENT, WaitReason.OWN_ERROR
    else:
        permanent = failure.disposition == Disposition.PERMANENT
        outcome = AttemptOutcome.PERMANENT if permanent else AttemptOutcome.DEAD
        wait_reason = WaitReason.NONE
        recorded = recorded or failure.error_class  # a dead row says why
    updated = queue.record(
        claim,
        decision,
        error=recorded,
        now=now,
        last_error_class=failure.error_class,
        wait_reason=wait_reason,
    )
    if updated and decision.action == Action.GIVE_UP:
        reason = DEAD_REASON.format(
            attempts=claim.attempts, error_class=failure.error_class, error=error
        )
        recap_mark_failed(recap_id=claim.recap_id, reason=reason, now=now)
    if not updated:
        return _lost_claim(claim, started_at, now, error)
    _history(
        claim.id,
        number=claim.attempts,
        started_at=started_at,
        finished_at=now,
        outcome=outcome,
        error_class=failure.error_class,
        error=error,
    )
    log = logger.warning if decision.action == Action.GIVE_UP else logger.info
    log(
        f"outbox.dispatch.{outcome}",
        extra={
            "side_effect_id": claim.id,
            "recap_id": str(claim.recap_id),
            "attempt": claim.attempts,
            "error_class": failure.error_class,
            "decision": decision.reason,
        },
    )
    return outcome


def side_effects_rearm_orphaned(
    *, now: datetime | None = None, ids: list[int] | None = None
) -> int:
    """Rows whose claim's holder is gone (its worker died, or its region was lost) go back to
    `pending` with the attempt given back (kernel/queue.py: a death is no verdict about the
    row, and the idempotency key makes the retry safe even if the request reached the
    service); OUTBOX_STALE_PROCESSING_SECONDS is the backstop. Deaths are counted on the
    row, never a death sentence. `ids`: only these (an operator's re-arm). Returns how
    many."""
    now = now or timezone.now()
    orphans = RecapSideEffect.objects.rearm_orphaned(
        now=now,
        backstop_seconds=settings.OUTBOX_STALE_PROCESSING_SECONDS,
        max_deaths=None,
        ids=ids,
    )
    for orphan in orphans:
        _history(
            orphan.id,
            number=orphan.attempts,
            started_at=orphan.claimed_at,
            finished_at=now,
            outcome=AttemptOutcome.REARMED_STALE,
            error=STALE_ERROR.format(claimed_at=orphan.claimed_at.isoformat()),
        )
    if orphans:
        logger.warning(
            "outbox.rearm_orphaned",
            extra={"count": len(orphans), "taken_back": sum(o.taken_back for o in orphans)},
        )
    return len(orphans)


# --- operator actions (the console calls these) ----------------------------------------------


def _locked(side_effect: RecapSideEffect) -> RecapSideEffect:
    return RecapSideEffect.objects.select_for_update().get(pk=side_effect.pk)


@transaction.atomic
def side_effect_rearm(
    *, side_effect: RecapSideEffect, new_render: bool = False, now: datetime | None = None
) -> RecapSideEffect:
    """Due now, with a fresh set of attempts; a `failed` recap goes back to `paid`.

    Dead and pending rows can always be re-armed; a processing row only once the worker
    that claimed it is gone (its claim taken back first, as the dispatcher's own re-arm
    would: kernel/queue.py), never under a worker that lives. A done row is re-armed only
    with `new_render=True` (recap_retry_render): that asks the render service for a *new*
    render under a new idempotency key.
    """
    now = now or timezone.now()
    row = _locked(side_effect)
    if row.status == SideEffectStatus.DONE and not new_render:
        raise OutboxError(SIDE_EFFECT_ALREADY_DONE.format(id=row.id))
    if row.status == SideEffectStatus.PROCESSING:
        if not side_effects_rearm_orphaned(now=now, ids=[row.pk]):
            raise OutboxError(
                SIDE_EFFECT_IN_FLIGHT.format(id=row.id, ttl=settings.CLAIM_HOLDER_TTL_SECONDS)
            )
        row = _locked(row)
    if row.status == SideEffectStatus.DONE:
        row.key_generation += 1
    previous = row.status
    row.status = SideEffectStatus.PENDING
    row.attempts = 0
    row.next_attempt_at = now
    row.claimed_at = None
    row.finished_at = None
    row.first_failed_at = None
    row.waiting_since = None
    row.wait_reason = WaitReason.NONE
    row.save()
    _history(
        row.id,
        number=0,
        started_at=now,
        finished_at=now,
        outcome=AttemptOutcome.REARMED,
        error=f"was {previous}" + (", new render requested" if new_render else ""),
    )
    recap_reopen(recap_id=row.recap_id, now=now)
    logger.info(
        "outbox.rearm",
        extra={"side_effect_id": row.id, "recap_id": str(row.recap_id), "was": previous},
    )
    return row


@transaction.atomic
def side_effect_mark_dead(
    *, side_effect: RecapSideEffect, reason: str, now: datetime | None = None
) -> RecapSideEffect:
    """Give up on a row by hand; the recap is `failed` with the operator's reason."""
    reason = reason.strip()
    if not reason:
        raise OutboxError(SIDE_EFFECT_REASON_REQUIRED)
    now = now or timezone.now()
    row = _locked(side_effect)
    if row.status == SideEffectStatus.DEAD:
        raise OutboxError(SIDE_EFFECT_ALREADY_DEAD.format(id=row.id))
    if row.status == SideEffectStatus.DONE:
        raise OutboxError(SIDE_EFFECT_ALREADY_DONE.format(id=row.id))
    message = OPERATOR_DEAD_REASON.format(reason=reason)
    row.status = SideEffectStatus.DEAD
    row.claimed_at = None
    row.finished_at = now
    row.last_error = message[:_ERROR_LIMIT]
    row.last_error_class = "operator"
    row.save()
    _history(
        row.id,
        number=row.attempts,
        started_at=now,
        finished_at=now,
        outcome=AttemptOutcome.MARKED_DEAD,
        error_class="operator",
        error=message,
    )
    recap_mark_failed(recap_id=row.recap_id, reason=message, now=now)
    logger.warning("outbox.mark_dead", extra={"side_effect_id": row.id})
    return row


@transaction.atomic
def side_effects_settle_for_ready(*, recap_id: RecapId, now: datetime | None = None) -> int:
    """The recap is ready (its callback arrived): rows still waiting have nothing left to
    do. A processing row is left to its worker, which finds the recap ready and finishes."""
    now = now or timezone.now()
    return RecapSideEffect.objects.filter(
        recap__pk=recap_id, status__in=[SideEffectStatus.PENDING, SideEffectStatus.DEAD]
    ).update(
        status=SideEffectStatus.DONE,
        claimed_at=None,
        finished_at=now,
        waiting_since=None,
        wait_reason=WaitReason.NONE,
        updated_at=now,
    )


@transaction.atomic
def recap_retry_render(*, recap: RecapVideo, now: datetime | None = None) -> RecapVideo:
    """Operator retry: render this recap (again), through the same outbox the workers use.

    - no render row (never enqueued): it is created;
    - the row is pending, dead or stale: it is re-armed (same idempotency key: if an earlier
      attempt did reach the service, the service returns that render instead of a new one);
    - the row is done (the service accepted a render that then failed): it is re-armed for
      a *new* render under a new idempotency key.
    A `failed` recap goes back to `paid`. A `rendering` one is refused (RecapStateConflict,
    with the render under way and when it is next asked about): a recap has at most one
    render outstanding, and a render the service lost is asked for again by the status
    check itself (render_lost_resend). A ready or unpaid one is refused too.
    """
    now = now or timezone.now()
    locked = recap_lock(recap_id=recap.pk)
    if locked.status == RecapStatus.RENDERING:
        check_at = locked.render_check_at.isoformat() if locked.render_check_at else "soon"
        raise RecapStateConflict(
            RECAP_RENDER_IN_FLIGHT.format(render_id=locked.render_id, check_at=check_at)
        )
    if locked.status not in (RecapStatus.PAID, RecapStatus.FAILED):
        raise RecapStateConflict(RECAP_NOT_RETRYABLE)
    row = RecapSideEffect.objects.filter(recap=locked, effect_type=EffectType.RENDER).first()
    if row is None:
        recap_reopen(recap_id=locked.pk, now=now)
        side_effect_enqueue(recap=locked, now=now)
    else:
        side_effect_rearm(side_effect=row, new_render=row.status == SideEffectStatus.DONE, now=now)
    logger.info("recaps.retry_render", extra={"recap_id": str(locked.pk)})
    return RecapVideo.objects.get(pk=locked.pk)


# --- the render service's answers: its callbacks (outbox/handlers.py) and status checks -----
#
# A callback is matched to the render it answers. The recap's current render is the one
# requested under its render row's idempotency key and, once the service accepted it, the
# render id it gave. A completion or failure about another render (an older key, after an
# operator's retry; another render id under the same key, after the service lost one and
# accepted it anew) is ignored, and the caller is told so (`stale`, written on the raw
# event's delivery: "stale callback for render …").


@dataclass(frozen=True)
class CallbackResult:
    # The recap changed (ready, or failed).
    applied: bool
    # Not about the recap's current render: why, in one line (the console shows it).
    stale: str = ""


def _callback_recap(
    *, recap_id: RecapId, render_id: str, idempotency_key: str, kind: str
) -> tuple[RecapVideo, str]:
    """The recap a callback is about, locked, and "" when (render_id, idempotency_key) is its
    current render — else why not (the callback is then ignored)."""
    recap = recap_lock(recap_id=recap_id)
    if recap.status in UNPAID_STATUSES:
        raise RenderCallbackBeforePayment()
    row = RecapSideEffect.objects.filter(recap=recap, effect_type=EffectType.RENDER).first()
    key_moved_on = row is not None and row.idempotency_key != idempotency_key
    if not key_moved_on and (not recap.render_id or recap.render_id == render_id):
        return recap, ""
    current = recap.render_id or (row.idempotency_key if row is not None else "none")
    logger.info("recaps.render_callback.stale", extra={"recap_id": str(recap.id)})
    return recap, STALE_CALLBACK.format(render_id=render_id or "?", kind=kind, current=current)


def _ready(recap_id: RecapId, *, video_url: str, render_id: str, now: datetime) -> bool:
    ready = recap_mark_ready(recap_id=recap_id, video_url=video_url, render_id=render_id, now=now)
    if ready:
        side_effects_settle_for_ready(recap_id=recap_id, now=now)
    return ready


@transaction.atomic
def render_completed_record(
    *,
    recap_id: RecapId,
    video_url: str,
    render_id: str,
    idempotency_key: str,
    now: datetime | None = None,
) -> CallbackResult:
    """The render service delivered the video of a render: the recap `ready` and its rows
    still waiting settled, in one transaction — if it is the recap's current render (else
    ignored, `stale`). Idempotent: a ready recap stays as it is. A completion beats an
    earlier `render.failed` of the same render (the service's last word)."""
    now = now or timezone.now()
    recap, stale = _callback_recap(
        recap_id=recap_id, render_id=render_id, idempotency_key=idempotency_key, kind="completed"
    )
    if stale:
        return CallbackResult(applied=False, stale=stale)
    return CallbackResult(
        applied=_ready(recap.id, video_url=video_url, render_id=render_id, now=now)
    )


@transaction.atomic
def render_failed_record(
    *,
    recap_id: RecapId,
    render_id: str,
    idempotency_key: str,
    reason: str,
    now: datetime | None = None,
) -> CallbackResult:
    """The render service gave up on a render: a verdict about it, so the recap is `failed`
    (visibly, with the reason; staff can retry it) — if it is the recap's current render,
    else ignored (`stale`). A ready or failed recap stays as it is."""
    recap, stale = _callback_recap(
        recap_id=recap_id, render_id=render_id, idempotency_key=idempotency_key, kind="failed"
    )
    if stale:
        return CallbackResult(applied=False, stale=stale)
    return CallbackResult(applied=recap_mark_failed(recap_id=recap.id, reason=reason, now=now))


@transaction.atomic
def render_status_record(
    *, recap_id: RecapId, status: RenderStatus, now: datetime | None = None
) -> str:
    """What the render service says about a render whose callback never arrived: `ready`,
    `failed` (the service gave up on it, as a `render.failed` callback would have said) or
    still `rendering` (asked again one interval later). Returns that, or "moved_on" when the
    recap no longer waits for exactly this render."""
    now = now or timezone.now()
    recap = recap_lock_if_rendering(recap_id=recap_id, render_id=status.render_id)
    if recap is None:
        return "moved_on"
    if status.state == "completed":
        _ready(recap.id, video_url=status.video_url, render_id=status.render_id, now=now)
        logger.info("recaps.render_check.ready", extra={"recap_id": str(recap.id)})
        return RecapStatus.READY
    if status.state == "failed":
        reason = RENDER_STATUS_FAILED_REASON.format(
            code=status.error_code[:64] or "unknown", message=status.error_message[:500]
        )
        recap_mark_failed(recap_id=recap.id, reason=reason, now=now)
        return RecapStatus.FAILED
    return RecapStatus.RENDERING


@transaction.atomic
def render_lost_resend(*, recap_id: RecapId, render_id: str, now: datetime | None = None) -> bool:
    """The render service does not know a render it accepted (HTTP 404 on its status check:
    it lost its state, or the answer came from a deploy's default backend). That is no
    verdict, so the recap is never failed for it: the render is asked for again, with the
    same idempotency key — the service answers with the same render if it has it, or
    accepts it anew. The recap goes back to `paid` (its render id forgotten) and its render
    row to `pending`, due now. False when the recap moved on meanwhile."""
    now = now or timezone.now()
    recap = recap_lock_if_rendering(recap_id=recap_id, render_id=render_id)
    if recap is None:
        return False
    row = (
        RecapSideEffect.objects.select_for_update()
        .filter(recap=recap, effect_type=EffectType.RENDER)
        .first()
    )
    if row is None or row.status != SideEffectStatus.DONE:
        return False  # someone is asking already (a row pending or in flight)
    recap_render_lost(recap_id=recap.id, now=now)
    RecapSideEffect.objects.filter(pk=row.pk).update(
        status=SideEffectStatus.PENDING,
        attempts=0,
        next_attempt_at=now,
        claimed_at=None,
        finished_at=None,
        first_failed_at=None,
        waiting_since=None,
        wait_reason=WaitReason.NONE,
        updated_at=now,
    )
    _history(
        row.pk,
        number=0,
        started_at=now,
        finished_at=now,
        outcome=AttemptOutcome.RESENT,
        error=RESENT_ERROR.format(render_id=render_id),
    )
    logger.warning(
        "outbox.render_lost.resend", extra={"recap_id": str(recap.id), "side_effect_id": row.pk}
    )
    return True


# --- nightly recovery (the seed's phase 4b, rebuilt) -----------------------------------------


@dataclass(frozen=True)
class RecoveryReport:
    created: int
    rearmed: int
    stuck_rendering: int

    def summary(self) -> str:
        return (
            f"created {self.created} missing side effects, re-armed {self.rearmed} stale "
            f"processing rows, {self.stuck_rendering} recaps rendering for more than "
            f"{settings.RECAP_STUCK_RENDERING_HOURS} h (see the console)"
        )


def outbox_recover(*, now: datetime | None = None) -> RecoveryReport:
    """Repair what a crash can leave behind; call nothing. The dispatcher does the work.

    - a `paid` recap without its render row (written before the enqueue was transactional,
      or by hand) gets the row;
    - rows whose claim's holder is gone are re-armed, and holders silent a day forgotten;
    - recaps `rendering` for longer than RECAP_STUCK_RENDERING_HOURS are counted. A lost
      callback does not end there: the nightly task asks the render service about overdue
      renders first (outbox/render_status.py), so what is still counted here is a render
      the service says is still running, or a service that cannot be asked.
    """
    now = now or timezone.now()
    created = 0
    for recap in recaps_paid_without_side_effect(effect_type=EffectType.RENDER):
        _, was_created = side_effect_enqueue(recap=recap, now=now)
        created += was_created
    rearmed = side_effects_rearm_orphaned(now=now)
    holders_prune(now=now)
    stuck = recaps_stuck_rendering(
        older_than=now - timedelta(hours=settings.RECAP_STUCK_RENDERING_HOURS)
    ).count()
    logger.info(
        "outbox.recover",
        extra={"created_rows": created, "rearmed_rows": rearmed, "stuck_rendering": stuck},
    )
    return RecoveryReport(created=created, rearmed=rearmed, stuck_rendering=stuck)
