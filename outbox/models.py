"""The recap outbox: one row per side effect a recap still owes the world.

`recap_side_effects` has the shape of the seed's table (recap, effect_type, status,
attempts, next_attempt_at defaulting to now(), UNIQUE (recap, effect_type)) plus what the
dispatcher and the console need: the claim time, the last error and its class, and a
history row per attempt so a dead row shows every error that led there.

It is a table of its own and not a column on an older outbox: a recap is its parent, and a
nullable parent would make a dispatch for a missing one a silent no-op (the seed's lesson).
"""

from django.db import models
from django.db.models import Q
from django.utils import timezone

from kernel.queue import Claim, WorkItem
from recaps.models import RecapId, RecapVideo


class EffectType(models.TextChoices):
    RENDER = "render", "request the render"


class SideEffectStatus(models.TextChoices):
    PENDING = "pending", "pending"
    PROCESSING = "processing", "processing"
    DONE = "done", "done"
    DEAD = "dead", "dead"


class WaitReason(models.TextChoices):
    """Why a pending row is waiting (the ops page and /metrics count rows per reason)."""

    NONE = "", "not waiting on anything (new or re-armed)"
    BREAKER = (
        "breaker",
        "the render service or its deploy answered about itself, or its breaker is open "
        "(not charged)",
    )
    AMBIGUOUS = (
        "ambiguous",
        "the render service's answer was neither a render nor a verdict (not charged; alerts)",
    )
    DATABASE = "database", "our own database failed (not charged)"
    OWN_ERROR = "own_error", "its own last attempt failed (charged)"
    CONFIGURATION = "configuration", "our configuration was incomplete (not charged)"


class SideEffectClaim(Claim):
    """A claimed side effect: what the dispatcher sends."""

    @property
    def recap_id(self) -> RecapId:
        return self.row["recap_id"]

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.recap_id, EffectType.RENDER, self.row["key_generation"])

    @property
    def traceparent(self) -> str:
        return str(self.row.get("traceparent") or "")


def idempotency_key(recap_id: RecapId, effect_type: str, generation: int) -> str:
    """Stable across retries of a row: the render service renders a key once."""
    return f"recap-{recap_id}-{effect_type}-g{generation}"


class RecapSideEffect(WorkItem):
    """The one queue's row (kernel/queue.py) for a side effect a recap owes."""

    recap = models.ForeignKey(RecapVideo, on_delete=models.CASCADE, related_name="side_effects")
    effect_type = models.CharField(max_length=32, choices=EffectType.choices)
    status = models.CharField(
        max_length=16,
        choices=SideEffectStatus.choices,
        default=SideEffectStatus.PENDING,
        db_default=SideEffectStatus.PENDING,
    )
    # Part of the idempotency key sent to the render service. It only changes when staff
    # deliberately ask for a *new* render after the service finished one (see
    # recap_retry_render); automatic retries and re-arms keep it, so an ambiguous timeout
    # followed by a retry can never render twice.
    key_generation = models.PositiveIntegerField(default=0)
    last_error_class = models.CharField(max_length=64, blank=True, default="")
    wait_reason = models.CharField(
        max_length=16,
        choices=WaitReason.choices,
        blank=True,
        default=WaitReason.NONE,
        db_default=WaitReason.NONE,
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    # The paid recap's span (kernel/tracing.py): every dispatch attempt, in whatever
    # dispatcher and however late, starts under it. "" when tracing is off.
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")

    claim_returns = ("recap_id", "key_generation", "traceparent")
    claim_class = SideEffectClaim
    touched_columns = ("updated_at",)
    on_rearm = {"wait_reason": "''"}

    class Meta:
        db_table = "recap_side_effects"
        constraints = [
            models.UniqueConstraint(
                fields=["recap", "effect_type"], name="recap_side_effect_unique"
            ),
            models.CheckConstraint(
                condition=Q(status__in=SideEffectStatus.values),
                name="recap_side_effect_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(effect_type__in=EffectType.values),
                name="recap_side_effect_type_valid",
            ),
            models.CheckConstraint(
                condition=Q(wait_reason__in=WaitReason.values),
                name="recap_side_effect_wait_reason_valid",
            ),
            models.CheckConstraint(
                condition=~Q(status=SideEffectStatus.PROCESSING) | Q(claimed_at__isnull=False),
                name="recap_side_effect_processing_has_claim",
            ),
            # A dead row always says why it died.
            models.CheckConstraint(
                condition=~Q(status=SideEffectStatus.DEAD) | ~Q(last_error=""),
                name="recap_side_effect_dead_has_error",
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status=SideEffectStatus.PENDING),
                name="recap_side_effect_due",
            ),
            models.Index(
                fields=["claimed_at"],
                condition=Q(status=SideEffectStatus.PROCESSING),
                name="recap_side_effect_processing",
            ),
            # The console: dead rows, rows finished lately (the drain rate), an error class.
            models.Index(
                fields=["id"],
                condition=Q(status=SideEffectStatus.DEAD),
                name="recap_side_effect_dead",
            ),
            models.Index(
                fields=["finished_at"],
                condition=Q(finished_at__isnull=False),
                name="recap_side_effect_finished",
            ),
            models.Index(
                fields=["last_error_class", "id"],
                condition=~Q(last_error_class=""),
                name="recap_side_effect_error",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.effect_type} for recap {self.recap_id} ({self.status})"

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.recap_id, self.effect_type, self.key_generation)


class AttemptOutcome(models.TextChoices):
    DONE = "done", "done"
    TRANSIENT = "transient", "transient error (will retry)"
    PERMANENT = "permanent", "permanent error"
    DEAD = "dead", "gave up after the last attempt"
    SKIPPED = "skipped", "skipped, circuit breaker open (not counted)"
    SERVICE_UNAVAILABLE = (
        "service_unavailable",
        "the render service or its deploy answered about itself (not counted)",
    )
    AMBIGUOUS = "ambiguous", "an answer neither a render nor a verdict (not counted)"
    DATABASE = "database", "our own database failed (not counted)"
    DEFERRED = "deferred", "released: our configuration was incomplete (not counted)"
    # Written before issue 27, when service failures were charged and refunded afterwards.
    REFUNDED = "refunded", "an earlier failure refunded: the breaker opened (not counted)"
    RESENT = (
        "resent",
        "asked again with the same key: the render service did not know the render",
    )
    LOST_CLAIM = "lost_claim", "finished after the row was re-armed (ignored)"
    REARMED_STALE = "rearmed_stale", "re-armed: its worker died (not counted)"
    REARMED = "rearmed", "re-armed by an operator"
    MARKED_DEAD = "marked_dead", "marked dead by an operator"


class RecapSideEffectAttempt(models.Model):
    """History: one row per attempt (and per re-arm), so the console shows every error."""

    side_effect = models.ForeignKey(
        RecapSideEffect, on_delete=models.CASCADE, related_name="history"
    )
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    outcome = models.CharField(max_length=32, choices=AttemptOutcome.choices)
    error_class = models.CharField(max_length=64, blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        db_table = "recap_side_effect_attempts"
        ordering = ["side_effect_id", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(outcome__in=AttemptOutcome.values),
                name="recap_side_effect_attempt_outcome_valid",
            )
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of side effect #{self.side_effect_id}: {self.outcome}"


class BreakerState(models.TextChoices):
    CLOSED = "closed", "closed (calls go through)"
    OPEN = "open", "open (calls skipped)"
    HALF_OPEN = "half_open", "half-open (one probe in flight)"


class CircuitBreaker(models.Model):
    """One row per breaker, shared by every dispatcher process on every host.

    Dispatchers read it without a lock (at most every RENDER_BREAKER_REFRESH_MS) and change
    it with one conditional UPDATE on `version` (optimistic concurrency, outbox/breaker.py):
    two processes cannot both take the half-open probe or lose a failure, and nobody holds
    its lock across a render call.
    """

    name = models.CharField(max_length=64, primary_key=True)
    state = models.CharField(
        max_length=16, choices=BreakerState.choices, default=BreakerState.CLOSED
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(null=True, blank=True)
    open_until = models.DateTimeField(null=True, blank=True)
    probe_started_at = models.DateTimeField(null=True, blank=True)
    # Side effects whose failures form the current streak (distinct ids, fewer than the
    # threshold): one row failing again and again never opens a proven breaker by itself.
    failing_rows = models.JSONField(default=list, blank=True)
    # The last render the service accepted, as far as the breaker wrote it down (at most
    # twice per cool-down): without one within the last cool-down the service is unproven,
    # and the first failure opens the breaker.
    last_success_at = models.DateTimeField(null=True, blank=True)
    version = models.PositiveBigIntegerField(default=0, db_default=0)
    last_error_class = models.CharField(max_length=64, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "outbox_circuit_breakers"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=BreakerState.values), name="breaker_state_valid"
            ),
            models.CheckConstraint(
                condition=~Q(state=BreakerState.OPEN) | Q(open_until__isnull=False),
                name="breaker_open_has_until",
            ),
            models.CheckConstraint(
                condition=~Q(state=BreakerState.HALF_OPEN) | Q(probe_started_at__isnull=False),
                name="breaker_half_open_has_probe",
            ),
        ]

    def __str__(self) -> str:
        return f"breaker {self.name} ({self.state})"
