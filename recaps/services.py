"""Every write to recaps: create, checkout, pay, redeem, and the render's status changes. The
status machine: docs/outbox.md, "Recap statuses"; Stripe's events in any order: docs/flows.md,
"Flow 3". Nothing here imports the outbox: "paid, render it" is the `recap_paid` signal.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

import stripe
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from kernel import tracing
from kernel.processing_region import require_processing_region
from kernel.stripe_api import stripe_client
from recaps.errors import (
    RECAP_IS_FREE,
    RECAP_NOT_FREE,
    RECAP_NOT_PAYABLE,
    RECAP_NOT_RENDERED,
    RECAP_NOT_YOURS,
    RECAP_PAYMENT_FAILED_TOO_LATE,
    RECAP_PAYMENT_PAID_ANOTHER,
    CheckoutNotConfigured,
    CheckoutUnavailable,
    RecapAlreadyPaid,
    RecapAlreadyRedeemed,
    RecapNotFound,
    RecapPermissionDenied,
    RecapStateConflict,
)
from recaps.models import UNPAID_STATUSES, Event, Photo, RecapId, RecapStatus, RecapVideo
from recaps.signals import recap_paid, recap_payment_withdrawn

logger = logging.getLogger(__name__)

_REASON_LIMIT = 2000
PAYMENT_FAILED_REASON = (
    "The asynchronous payment of checkout {session} failed (Stripe event {event}); waiting "
    "for a new payment."
)
CHECKOUT_EXPIRED_REASON = "Checkout {session} expired unpaid; a new checkout can pay it."


def render_deadline() -> timedelta:
    """How long after the render was accepted its callback may take before we ask."""
    return timedelta(
        seconds=settings.RENDER_EXPECTED_SECONDS + settings.RENDER_CALLBACK_MARGIN_SECONDS
    )


def recap_lock(*, recap_id: RecapId) -> RecapVideo:
    """The recap, locked FOR UPDATE until the caller's transaction ends (RecapNotFound)."""
    try:
        return RecapVideo.objects.select_for_update().get(pk=recap_id)
    except (RecapVideo.DoesNotExist, ValueError) as exc:  # ValueError: not a UUID
        raise RecapNotFound() from exc


@transaction.atomic
def event_create(*, title: str, photo_storage_keys: list[str]) -> Event:
    """An event and its photos (in the order given), in one transaction."""
    require_processing_region()  # events and photos are processing state (multi-region.md)
    event = Event.objects.create(title=title)
    Photo.objects.bulk_create(Photo(event=event, storage_key=key) for key in photo_storage_keys)
    logger.info("recaps.event_created", extra={"event_id": event.id})
    return event


@transaction.atomic
def recap_create(*, event: Event, buyer: User, is_free: bool = False) -> RecapVideo:
    # Recaps are processing state: created only in the processing region (multi-region.md).
    require_processing_region()
    recap = RecapVideo.objects.create(event=event, buyer=buyer, is_free=is_free)
    logger.info("recaps.created", extra={"recap_id": str(recap.id), "event_id": event.id})
    return recap


# --- purchase ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkout:
    session_id: str
    url: str


def recap_checkout_create(*, recap: RecapVideo, buyer: User) -> Checkout:
    """A Stripe Checkout Session for the recap, with its id in the session's metadata.

    Not atomic as a whole: a transaction open across the call would hold a connection and
    the recap's lock for the SDK's worst case. The idempotency key makes a double click
    return the same session. Refused in the standby region before Stripe is asked."""
    require_processing_region()
    recap = _recap_for_checkout(recap_id=recap.pk, buyer=buyer)
    if not settings.STRIPE_API_KEY:
        raise CheckoutNotConfigured()
    title = recap.event.title if recap.event else "EventDrop recap"
    params = {
        "mode": "payment",
        "client_reference_id": str(recap.id),
        "metadata": {"recap_id": str(recap.id)},
        "payment_intent_data": {"metadata": {"recap_id": str(recap.id)}},
        "line_items": [
            {
                "quantity": 1,
                "price_data": {
                    "currency": settings.RECAP_CURRENCY,
                    "unit_amount": settings.RECAP_PRICE_CENTS,
                    "product_data": {"name": f"Recap: {title}"[:250]},
                },
            }
        ],
        "success_url": settings.RECAP_CHECKOUT_SUCCESS_URL.format(recap_id=recap.id),
        "cancel_url": settings.RECAP_CHECKOUT_CANCEL_URL.format(recap_id=recap.id),
    }
    try:
        with stripe_client() as client:
            session = client.v1.checkout.sessions.create(
                params=params,  # type: ignore[arg-type]
                options={"idempotency_key": _checkout_idempotency_key(recap)},
            )
    except stripe.StripeError as exc:
        logger.warning(
            "recaps.checkout.failed",
            extra={"recap_id": str(recap.id), "error_class": type(exc).__name__},
        )
        raise CheckoutUnavailable() from exc
    recap_checkout_attach(recap_id=recap.id, session_id=session.id)
    logger.info(
        "recaps.checkout.created", extra={"recap_id": str(recap.id), "session_id": session.id}
    )
    return Checkout(session_id=session.id, url=session.url or "")


def _checkout_idempotency_key(recap: RecapVideo) -> str:
    """One session per recap however often it is asked for, except after that session
    expired: Stripe would answer the expired one again (it keeps a key for 24 h)."""
    if recap.status == RecapStatus.CHECKOUT_EXPIRED:
        return f"recap-checkout-{recap.id}-after-{recap.checkout_session_id}"
    return f"recap-checkout-{recap.id}"


@transaction.atomic
def _recap_for_checkout(*, recap_id: RecapId, buyer: User) -> RecapVideo:
    recap = recap_lock(recap_id=recap_id)
    if recap.buyer_id != buyer.pk:
        raise RecapPermissionDenied(RECAP_NOT_YOURS)
    if recap.is_free:
        raise RecapPermissionDenied(RECAP_IS_FREE)
    if recap.status not in UNPAID_STATUSES:
        raise RecapAlreadyPaid(RECAP_NOT_PAYABLE)
    return RecapVideo.objects.select_related("event").get(pk=recap.pk)


@transaction.atomic
def recap_checkout_attach(*, recap_id: RecapId, session_id: str) -> None:
    """The recap's current checkout is this session; an expired one is waiting again. A
    session it already had (Stripe's idempotent answer) keeps what its events said."""
    recap = recap_lock(recap_id=recap_id)
    if recap.checkout_session_id == session_id or recap.status not in UNPAID_STATUSES:
        return
    RecapVideo.objects.filter(pk=recap.pk).update(
        checkout_session_id=session_id,
        status=RecapStatus.PENDING_PAYMENT,
        awaiting_payment_reason="",
        checkout_event_at=None,
        updated_at=timezone.now(),
    )


# --- paid: by Stripe, or redeemed for free -----------------------------------------------------


@transaction.atomic
def recap_mark_paid(
    *, recap_id: RecapId, payment_reference: str = "", now: datetime | None = None
) -> tuple[RecapVideo, bool]:
    """One transaction: the recap `paid`, its payment reference, and its outbox row (the
    receiver of `recap_paid`). Returns (recap, changed): the same payment again changes
    nothing; a *different* one for a paid recap is refused (RecapAlreadyPaid) so that someone
    can refund it. An empty payment reference means a free redemption."""
    now = now or timezone.now()
    recap = recap_lock(recap_id=recap_id)
    if recap.status not in UNPAID_STATUSES:
        if payment_reference and recap.payment_reference == payment_reference:
            logger.info("recaps.paid.duplicate", extra={"recap_id": str(recap.id)})
            return recap, False
        raise RecapAlreadyPaid() if payment_reference else RecapAlreadyRedeemed()
    if recap.is_free and payment_reference:
        raise RecapStateConflict(RECAP_IS_FREE)
    if payment_reference and (
        RecapVideo.objects.filter(payment_reference=payment_reference).exclude(pk=recap.pk).exists()
    ):
        # Refused here, as a conflict, rather than by the UNIQUE constraint's IntegrityError,
        # which would read as a transient failure and be retried for nothing.
        raise RecapStateConflict(RECAP_PAYMENT_PAID_ANOTHER)
    if not recap.is_free and not payment_reference:
        raise RecapPermissionDenied(RECAP_NOT_FREE)
    recap.status = RecapStatus.PAID
    recap.payment_reference = payment_reference
    recap.paid_at = now
    recap.awaiting_payment_reason = ""
    # Under the payment's delivery span: the render row stores this span's context, so the
    # recap's trace continues the payment's (kernel/tracing.py).
    with tracing.span(
        "recap paid",
        attributes={"eventdrop.recap_id": str(recap.id), "eventdrop.free": recap.is_free},
    ):
        recap.save(
            update_fields=[
                "status",
                "payment_reference",
                "paid_at",
                "awaiting_payment_reason",
                "updated_at",
            ]
        )
        recap_paid.send(sender=RecapVideo, recap=recap, now=now)
    logger.info("recaps.paid", extra={"recap_id": str(recap.id), "free": recap.is_free})
    return recap, True


@transaction.atomic
def recap_redeem_free(*, recap_id: RecapId, user: User, now: datetime | None = None) -> RecapVideo:
    """The buyer redeems a free recap: the same path as a payment, without one. Refused in
    the standby region (docs/multi-region.md)."""
    require_processing_region()
    recap = recap_lock(recap_id=recap_id)
    if recap.buyer_id != user.pk:
        raise RecapPermissionDenied(RECAP_NOT_YOURS)
    if not recap.is_free:
        raise RecapPermissionDenied(RECAP_NOT_FREE)
    if recap.status != RecapStatus.PENDING_PAYMENT:
        raise RecapAlreadyRedeemed()
    recap, _ = recap_mark_paid(recap_id=recap.id, now=now)
    return recap


# --- Stripe's checkout events, in any order (recaps/handlers.py) ------------------------------


class CheckoutEventKind(StrEnum):
    # checkout.session.completed with payment_status `paid`, or `no_payment_required` (a
    # 100 % coupon: paid without a charge), and checkout.session.async_payment_succeeded.
    PAID = "paid"
    # checkout.session.async_payment_failed.
    PAYMENT_FAILED = "payment_failed"
    # checkout.session.expired.
    EXPIRED = "expired"


class CheckoutOutcome(StrEnum):
    PAID = "paid"
    DUPLICATE = "duplicate"  # the same payment again: nothing changed
    AWAITING_PAYMENT = "awaiting_payment"  # the payment failed: waiting again, with the reason
    EXPIRED = "expired"  # the unpaid checkout is closed
    SUPERSEDED = "superseded"  # older than an event of this session already applied
    NOT_CURRENT = "not_current"  # a failure or expiry of a checkout the recap moved on from
    UNCHANGED = "unchanged"  # nothing to do (an expiry of a paid recap, …)


@dataclass(frozen=True)
class CheckoutEvent:
    kind: CheckoutEventKind
    session_id: str
    # Stripe's `created` of the event (the provider's clock, not our arrival order).
    created_at: datetime
    # PAID: the PaymentIntent, or the session itself when there is no charge.
    payment_reference: str = ""
    event_id: str = ""


@transaction.atomic
def checkout_event_apply(
    *, recap_id: RecapId, event: CheckoutEvent, now: datetime | None = None
) -> CheckoutOutcome:
    """One Stripe checkout event, applied to its recap (the rules: docs/flows.md, "Flow 3").

    Besides the inbox's ordering, an older event of the current session never undoes a newer
    one (`checkout_event_at`); a failure or expiry of another session changes nothing."""
    now = now or timezone.now()
    recap = recap_lock(recap_id=recap_id)
    current = recap.checkout_session_id in ("", event.session_id)
    if current and recap.checkout_event_at and event.created_at < recap.checkout_event_at:
        logger.info("recaps.checkout.superseded", extra={"recap_id": str(recap.id)})
        return CheckoutOutcome.SUPERSEDED
    if event.kind == CheckoutEventKind.PAID:
        recap, changed = recap_mark_paid(
            recap_id=recap.id, payment_reference=event.payment_reference, now=now
        )
        if changed:
            _checkout_event_record(recap, event)
        return CheckoutOutcome.PAID if changed else CheckoutOutcome.DUPLICATE
    if not current:
        logger.info("recaps.checkout.not_current", extra={"recap_id": str(recap.id)})
        return CheckoutOutcome.NOT_CURRENT
    if event.kind == CheckoutEventKind.PAYMENT_FAILED:
        return _checkout_payment_failed(recap, event, now)
    if recap.status != RecapStatus.PENDING_PAYMENT:
        return CheckoutOutcome.UNCHANGED  # already expired, or paid: nothing to close
    recap.status = RecapStatus.CHECKOUT_EXPIRED
    recap.awaiting_payment_reason = CHECKOUT_EXPIRED_REASON.format(session=event.session_id)
    _checkout_event_record(recap, event, also=["status", "awaiting_payment_reason"])
    logger.info("recaps.checkout.expired", extra={"recap_id": str(recap.id)})
    return CheckoutOutcome.EXPIRED


def _checkout_payment_failed(
    recap: RecapVideo, event: CheckoutEvent, now: datetime
) -> CheckoutOutcome:
    if recap.status not in (*UNPAID_STATUSES, RecapStatus.PAID):
        raise RecapStateConflict(RECAP_PAYMENT_FAILED_TOO_LATE.format(status=recap.status))
    if recap.status == RecapStatus.PAID:
        # The outbox withdraws the render row it has not claimed yet, or refuses (raises),
        # which rolls this back: then the render was already requested.
        recap_payment_withdrawn.send(sender=RecapVideo, recap=recap, now=now)
    recap.status = RecapStatus.PENDING_PAYMENT
    recap.payment_reference = ""
    recap.paid_at = None
    recap.awaiting_payment_reason = PAYMENT_FAILED_REASON.format(
        session=event.session_id, event=event.event_id or "?"
    )
    _checkout_event_record(
        recap, event, also=["status", "payment_reference", "paid_at", "awaiting_payment_reason"]
    )
    logger.warning("recaps.checkout.payment_failed", extra={"recap_id": str(recap.id)})
    return CheckoutOutcome.AWAITING_PAYMENT


def _checkout_event_record(
    recap: RecapVideo, event: CheckoutEvent, *, also: list[str] | None = None
) -> None:
    recap.checkout_session_id = event.session_id
    recap.checkout_event_at = max(filter(None, [recap.checkout_event_at, event.created_at]))
    recap.save(
        update_fields=[*(also or []), "checkout_session_id", "checkout_event_at", "updated_at"]
    )


# --- the render's progress (driven by the outbox and the render service's callbacks) -------


@transaction.atomic
def recap_mark_rendering(*, recap_id: RecapId, render_id: str, now: datetime | None = None) -> bool:
    """The render service accepted the render. Only a `paid` recap moves: a callback may
    have made it `ready` already (the service can be faster than our bookkeeping). If no
    callback has come by `render_check_at`, the service is asked (outbox/render_status.py)."""
    now = now or timezone.now()
    return bool(
        RecapVideo.objects.filter(pk=recap_id, status=RecapStatus.PAID).update(
            status=RecapStatus.RENDERING,
            render_id=render_id,
            rendering_at=now,
            render_check_at=now + render_deadline(),
            updated_at=now,
        )
    )


@transaction.atomic
def recap_mark_failed(*, recap_id: RecapId, reason: str, now: datetime | None = None) -> bool:
    """Terminal, visible failure with its reason. Only the outbox's dead path, an operator
    and a permanent render failure call this; a ready recap is never failed."""
    now = now or timezone.now()
    failed = RecapVideo.objects.filter(
        pk=recap_id, status__in=[RecapStatus.PAID, RecapStatus.RENDERING]
    ).update(
        status=RecapStatus.FAILED,
        failure_reason=reason[:_REASON_LIMIT] or "failed",
        failed_at=now,
        render_check_at=None,
        updated_at=now,
    )
    if failed:
        logger.warning("recaps.failed", extra={"recap_id": str(recap_id)})
    return bool(failed)


@transaction.atomic
def recap_reopen(*, recap_id: RecapId, now: datetime | None = None) -> bool:
    """failed → paid, for a retry; other statuses are left alone. The failed render's id
    goes: the render the recap waits for now is the one the service will name next (a
    callback of the old one is then told apart, outbox/services.py)."""
    now = now or timezone.now()
    return bool(
        RecapVideo.objects.filter(pk=recap_id, status=RecapStatus.FAILED).update(
            status=RecapStatus.PAID, failure_reason="", failed_at=None, render_id="", updated_at=now
        )
    )


@transaction.atomic
def recap_mark_ready(
    *, recap_id: RecapId, video_url: str, render_id: str = "", now: datetime | None = None
) -> bool:
    """The render service delivered the video. Idempotent: a ready recap stays as it is.
    Returns whether it changed (the outbox then settles the recap's waiting rows)."""
    now = now or timezone.now()
    recap = recap_lock(recap_id=recap_id)
    if recap.status == RecapStatus.READY:
        return False
    if recap.status in UNPAID_STATUSES:
        raise RecapStateConflict(RECAP_NOT_RENDERED)
    recap.status = RecapStatus.READY
    recap.video_url = video_url
    recap.render_id = recap.render_id or render_id
    recap.ready_at = now
    recap.failure_reason = ""
    recap.failed_at = None
    recap.render_check_at = None
    recap.save()
    logger.info("recaps.ready", extra={"recap_id": str(recap.id), "render_id": render_id})
    return True


# --- a lost completion callback: the outbox asks the render service (outbox/render_status.py)


@dataclass(frozen=True)
class RenderCheckClaim:
    recap_id: RecapId
    render_id: str


_CLAIM_RENDER_CHECKS = (
    "WITH due AS ("
    " SELECT id FROM recap_videos"
    " WHERE status = 'rendering' AND render_check_at <= %(now)s AND render_id <> ''"
    " ORDER BY render_check_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
    " UPDATE recap_videos AS r SET render_check_at = %(next)s, updated_at = %(now)s"
    " FROM due WHERE r.id = due.id RETURNING r.id, r.render_id"
)


def recaps_claim_render_checks(
    *, limit: int, now: datetime | None = None
) -> list[RenderCheckClaim]:
    """Claim up to `limit` rendering recaps whose check is due, in one statement (SKIP LOCKED).
    The next check is scheduled before anyone asks: two runs never ask about one render at
    once, and a run that dies leaves each claimed recap due again one interval later."""
    now = now or timezone.now()
    later = now + timedelta(seconds=settings.RENDER_CHECK_INTERVAL_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_RENDER_CHECKS, {"now": now, "next": later, "limit": limit})
        claimed = cursor.fetchall()
    return [
        RenderCheckClaim(recap_id=recap_id, render_id=render_id) for recap_id, render_id in claimed
    ]


def recap_lock_if_rendering(*, recap_id: RecapId, render_id: str) -> RecapVideo | None:
    """The locked recap if it is still waiting for exactly this render; None if it moved on
    (its callback arrived meanwhile, or an operator asked for a new render). Call it inside
    a transaction: the lock holds until the caller's write commits."""
    recap = recap_lock(recap_id=recap_id)
    if recap.status != RecapStatus.RENDERING or recap.render_id != render_id:
        return None
    return recap


@transaction.atomic
def recap_render_lost(*, recap_id: RecapId, now: datetime | None = None) -> bool:
    """rendering → paid: the render service does not know the render it accepted, so the
    outbox asks for it again under the same idempotency key (outbox.services.
    render_lost_resend). The render id is forgotten until the service names one again."""
    now = now or timezone.now()
    return bool(
        RecapVideo.objects.filter(pk=recap_id, status=RecapStatus.RENDERING).update(
            status=RecapStatus.PAID,
            render_id="",
            rendering_at=None,
            render_check_at=None,
            updated_at=now,
        )
    )
