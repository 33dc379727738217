"""Events, their photos, and the recap videos sold for them.

The rules a recap's status implies live in the database as CHECK constraints, so a bug (or
a hand-written UPDATE) cannot produce a `failed` recap without a reason, a `ready` one
without a video, or a paid one without a payment.
"""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Event(models.Model):
    """An EventDrop event: the photos of one occasion."""

    title = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.title


class Photo(models.Model):
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="photos")
    # Where the render service fetches it (an object-storage key); never a local path.
    storage_key = models.CharField(max_length=500)
    taken_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["event", "taken_at"], name="photo_event_taken_at")]

    def __str__(self) -> str:
        return self.storage_key


class RecapStatus(models.TextChoices):
    PENDING_PAYMENT = "pending_payment", "waiting for payment"
    # Its Stripe Checkout Session expired unpaid; a new checkout (or a late payment) reopens it.
    CHECKOUT_EXPIRED = "checkout_expired", "checkout expired unpaid"
    PAID = "paid", "paid, render queued"
    RENDERING = "rendering", "accepted by the render service"
    READY = "ready", "ready"
    FAILED = "failed", "failed"


# A recap's primary key as callers hold it: the UUID, or its text from a payload or a URL.
RecapId = uuid.UUID | str

# Not paid (yet): a payment may still come, and nothing has been sent to the render service.
UNPAID_STATUSES = (RecapStatus.PENDING_PAYMENT, RecapStatus.CHECKOUT_EXPIRED)


class RecapVideo(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # SET_NULL, not CASCADE: a paid recap outlives its event (accounting, support); the
    # dispatcher reports a missing event as a permanent error instead.
    event = models.ForeignKey(
        Event, null=True, blank=True, on_delete=models.SET_NULL, related_name="recaps"
    )
    buyer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="recap_videos"
    )
    status = models.CharField(
        max_length=16, choices=RecapStatus.choices, default=RecapStatus.PENDING_PAYMENT
    )
    is_free = models.BooleanField(default=False)
    # The Stripe PaymentIntent (or, without one, the Checkout Session) that paid for it.
    payment_reference = models.CharField(max_length=255, blank=True, default="")
    checkout_session_id = models.CharField(max_length=255, blank=True, default="")
    # While unpaid: why it is (still) waiting for a payment — the last asynchronous payment
    # failed, or the checkout expired. Empty otherwise.
    awaiting_payment_reason = models.TextField(blank=True, default="")
    # Stripe's `created` of the newest event applied for the current checkout session: an
    # older event of that session arriving late changes nothing (checkout_event_apply).
    checkout_event_at = models.DateTimeField(null=True, blank=True)
    render_id = models.CharField(max_length=255, blank=True, default="")
    video_url = models.URLField(max_length=1000, blank=True, default="")
    failure_reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    rendering_at = models.DateTimeField(null=True, blank=True)
    # While `rendering`: when to ask the render service about this render if its completion
    # callback has not arrived (rendering_at + expected time + margin, then every check
    # interval; outbox/render_status.py). A lost callback is not a one-way street.
    render_check_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "recap_videos"
        indexes = [
            models.Index(fields=["status", "updated_at"], name="recap_status_updated"),
            models.Index(fields=["buyer", "created_at"], name="recap_buyer_created"),
            # The console's lists (newest first) and its exact searches.
            models.Index(fields=["updated_at"], name="recap_updated"),
            models.Index(fields=["created_at", "id"], name="recap_created"),
            models.Index(
                fields=["checkout_session_id"],
                condition=~Q(checkout_session_id=""),
                name="recap_checkout_session",
            ),
            models.Index(fields=["render_id"], condition=~Q(render_id=""), name="recap_render_id"),
            # The render checks' claim: only rendering recaps, by when they are due.
            models.Index(
                fields=["render_check_at"],
                condition=Q(status=RecapStatus.RENDERING),
                name="recap_render_check_due",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=RecapStatus.values), name="recap_status_valid"
            ),
            # `failed` always says why, and nothing else carries a stale reason.
            models.CheckConstraint(
                condition=(
                    Q(status=RecapStatus.FAILED, failed_at__isnull=False) & ~Q(failure_reason="")
                    | ~Q(status=RecapStatus.FAILED) & Q(failure_reason="")
                ),
                name="recap_failed_has_reason",
            ),
            models.CheckConstraint(
                condition=~Q(status=RecapStatus.READY)
                | ~Q(video_url="") & Q(ready_at__isnull=False),
                name="recap_ready_has_video",
            ),
            # Past the unpaid statuses a recap was paid: by a payment, or for free.
            models.CheckConstraint(
                condition=Q(status__in=UNPAID_STATUSES)
                | Q(paid_at__isnull=False) & (Q(is_free=True) | ~Q(payment_reference="")),
                name="recap_paid_has_payment",
            ),
            # Only an unpaid recap waits for a payment with a reason.
            models.CheckConstraint(
                condition=Q(status__in=UNPAID_STATUSES) | Q(awaiting_payment_reason=""),
                name="recap_awaiting_reason_only_unpaid",
            ),
            models.CheckConstraint(
                condition=Q(is_free=False) | Q(payment_reference=""),
                name="recap_free_has_no_payment",
            ),
            # One payment pays for one recap.
            models.UniqueConstraint(
                fields=["payment_reference"],
                condition=~Q(payment_reference=""),
                name="recap_payment_reference_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"recap {self.id} ({self.status})"
