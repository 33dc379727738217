"""The operator audit trail: who pushed what back into the pipeline, when, and what came of it.

Rows are written only by console.services, which wraps every replay, re-verify, re-arm,
mark-dead and retry; nothing edits or deletes them afterwards (the admin is read-only).
"""

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone


class OperatorActionKind(models.TextChoices):
    RAW_EVENT_REPLAY = "raw_event_replay", "replay raw events"
    RAW_EVENT_REVERIFY = "raw_event_reverify", "re-verify raw events"
    SIDE_EFFECT_REARM = "side_effect_rearm", "re-arm side effects"
    SIDE_EFFECT_MARK_DEAD = "side_effect_mark_dead", "mark side effects dead"
    RECAP_RETRY_RENDER = "recap_retry_render", "retry recap render"


class OperatorActionVia(models.TextChoices):
    ADMIN = "admin", "admin"
    API = "api", "API"


class OperatorActionOutcome(models.TextChoices):
    # The row is written before the first object is touched, so a worker that dies half-way
    # leaves a `running` row behind instead of no trace at all.
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "every object succeeded"
    PARTIAL = "partial", "some succeeded, others were refused or failed"
    REFUSED = "refused", "every object was refused"
    FAILED = "failed", "nothing succeeded and at least one object failed"


class ItemOutcome(models.TextChoices):
    """Per-object result stored in OperatorAction.results."""

    OK = "ok", "ok"
    REFUSED = "refused", "refused by the domain service"
    ERROR = "error", "unexpected error"


class ActorRecord(models.Model):
    """Who did it, for the audit trails below."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # Kept as text too: the audit trail must outlive the user account it names.
    actor_username = models.CharField(max_length=150)

    class Meta:
        abstract = True


class OperatorAction(ActorRecord):
    action = models.CharField(max_length=32, choices=OperatorActionKind.choices)
    via = models.CharField(max_length=8, choices=OperatorActionVia.choices)
    # "app_label.model" of the objects acted on, and their primary keys in request order.
    target_model = models.CharField(max_length=100)
    target_ids = models.JSONField(default=list)
    requested = models.PositiveIntegerField()
    succeeded = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    outcome = models.CharField(
        max_length=16,
        choices=OperatorActionOutcome.choices,
        default=OperatorActionOutcome.RUNNING,
    )
    # One {"id", "outcome", "detail"} object per target: domain messages, never payloads.
    results = models.JSONField(default=list)
    # Free text an operator gave with the action (e.g. why a side effect was marked dead).
    note = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        default_permissions = ("view",)
        permissions = [
            ("operate", "Can replay, re-verify, re-arm, mark dead and retry from the console"),
            # Read-only, but it reveals volumes per source and failure reasons: not every
            # staff member needs it (console/ops.py, the /ops/ page and /metrics).
            ("view_ops", "Can view the operations page and /metrics"),
        ]
        indexes = [
            models.Index(fields=["-started_at"], name="operatoraction_started"),
            models.Index(fields=["action", "-started_at"], name="operatoraction_action"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(action__in=OperatorActionKind.values),
                name="operatoraction_action_valid",
            ),
            models.CheckConstraint(
                condition=Q(via__in=OperatorActionVia.values),
                name="operatoraction_via_valid",
            ),
            models.CheckConstraint(
                condition=Q(outcome__in=OperatorActionOutcome.values),
                name="operatoraction_outcome_valid",
            ),
            models.CheckConstraint(
                condition=Q(requested__gt=0),
                name="operatoraction_requested_positive",
            ),
            models.CheckConstraint(
                condition=Q(
                    requested__gte=F("succeeded") + F("refused") + F("failed"),
                ),
                name="operatoraction_counts_fit",
            ),
            # Finished exactly when no longer running, and then every object is accounted for.
            models.CheckConstraint(
                condition=(
                    Q(outcome="running", finished_at__isnull=True)
                    | (
                        ~Q(outcome="running")
                        & Q(finished_at__isnull=False)
                        & Q(requested=F("succeeded") + F("refused") + F("failed"))
                    )
                ),
                name="operatoraction_finished_consistent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_action_display()} x{self.requested} by {self.actor_username}"


class PayloadAccessKind(models.TextChoices):
    VIEW = "view", "viewed body and headers of one event"
    DOWNLOAD = "download", "downloaded the exact body bytes"
    LIST = "list", "listed events with bodies and headers"
    SEARCH = "search", "searched body text"


class PayloadAccess(ActorRecord):
    """Who saw which webhook payloads, or searched their text, when and through what.

    Written by console.services.payload_access_record before the payload leaves the server
    (admin detail page, raw download, API detail and list with payloads, every body search),
    never edited. A body search's term is itself a body fragment: it is kept here, for the
    auditors (`console.view_payloadaccess`), and nowhere else — never in a log line.
    """

    kind = models.CharField(max_length=16, choices=PayloadAccessKind.choices)
    via = models.CharField(max_length=8, choices=OperatorActionVia.choices)
    # The events whose body or headers were shown (a search's matches are not listed: an
    # admin search is a lazy queryset, and its rows are shown without their bodies).
    raw_event_ids = models.JSONField(default=list, blank=True)
    search_term = models.TextField(blank=True, default="")
    accessed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-accessed_at", "-id"]
        default_permissions = ("view",)
        verbose_name = "payload access"
        verbose_name_plural = "payload accesses"
        indexes = [models.Index(fields=["-accessed_at"], name="payloadaccess_accessed")]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=PayloadAccessKind.values), name="payloadaccess_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(via__in=OperatorActionVia.values), name="payloadaccess_via_valid"
            ),
            # A search names its term; anything else names the rows it showed.
            models.CheckConstraint(
                condition=(
                    Q(kind=PayloadAccessKind.SEARCH) & ~Q(search_term="")
                    | ~Q(kind=PayloadAccessKind.SEARCH) & Q(search_term="")
                ),
                name="payloadaccess_search_has_term",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} by {self.actor_username}"


# The receive view's ACK histogram buckets (ingress.views.ACK_SECONDS), one column each, as
# (upper bound in seconds, column). A test holds the two in step; a changed bucket is a
# migration.
ACK_ROLLUP_BUCKETS: tuple[tuple[float, str], ...] = (
    (0.001, "le_1ms"),
    (0.0025, "le_2_5ms"),
    (0.005, "le_5ms"),
    (0.01, "le_10ms"),
    (0.025, "le_25ms"),
    (0.05, "le_50ms"),
    (0.1, "le_100ms"),
    (0.125, "le_125ms"),
    (0.25, "le_250ms"),
    (0.5, "le_500ms"),
    (1.0, "le_1s"),
    (2.5, "le_2_5s"),
    (5.0, "le_5s"),
    (10.0, "le_10s"),
    (float("inf"), "le_inf"),
)


class AckLatencyHour(models.Model):
    """ACKs of one source in one clock hour, counted per histogram bucket (not cumulative).

    Every web process adds what its histogram counted since its last flush
    (console/ack_rollup.py, INSERT … ON CONFLICT DO UPDATE adding), so rows sum over
    processes and hosts; the ops page charts p99 per hour from them. Kept 48 h.
    """

    source = models.CharField(max_length=64)
    hour = models.DateTimeField()
    le_1ms = models.BigIntegerField(default=0)
    le_2_5ms = models.BigIntegerField(default=0)
    le_5ms = models.BigIntegerField(default=0)
    le_10ms = models.BigIntegerField(default=0)
    le_25ms = models.BigIntegerField(default=0)
    le_50ms = models.BigIntegerField(default=0)
    le_100ms = models.BigIntegerField(default=0)
    le_125ms = models.BigIntegerField(default=0)
    le_250ms = models.BigIntegerField(default=0)
    le_500ms = models.BigIntegerField(default=0)
    le_1s = models.BigIntegerField(default=0)
    le_2_5s = models.BigIntegerField(default=0)
    le_5s = models.BigIntegerField(default=0)
    le_10s = models.BigIntegerField(default=0)
    le_inf = models.BigIntegerField(default=0)

    class Meta:
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["source", "hour"], name="acklatencyhour_source_hour")
        ]
        indexes = [models.Index(fields=["hour"], name="acklatencyhour_hour")]

    def __str__(self) -> str:
        return f"{self.source} {self.hour:%Y-%m-%d %H:00}"

    def bucket_counts(self) -> list[int]:
        return [getattr(self, column) for _, column in ACK_ROLLUP_BUCKETS]
