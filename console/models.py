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
    # The answer to questioned events' repeated signatures (ingress/signature_replays.py).
    RAW_EVENT_ACCEPT_REPEAT = "raw_event_accept_repeat", "accept repeated signatures as genuine"
    RAW_EVENT_REJECT_REPEAT = "raw_event_reject_repeat", "reject repeated signatures as replays"
    SIDE_EFFECT_REARM = "side_effect_rearm", "re-arm side effects"
    SIDE_EFFECT_MARK_DEAD = "side_effect_mark_dead", "mark side effects dead"
    RECAP_RETRY_RENDER = "recap_retry_render", "retry recap render"
    # Bulk jobs (console/jobs/services.py) record one action each, with the job's final counts.
    DELIVERY_REARM = "delivery_rearm", "re-arm deliveries"
    HANDLER_PAUSE = "handler_pause", "pause handlers"
    HANDLER_RESUME = "handler_resume", "resume handlers"
    INCIDENT_ACKNOWLEDGE = "incident_acknowledge", "acknowledge an incident"
    INCIDENT_RESOLVE = "incident_resolve", "resolve an incident"
    PROCESSING_REGION = "processing_region", "switch the processing region"


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
    # A bulk job stopped by an operator: the counts cover what was done before it stopped,
    # the rest of the selection is counted as skipped.
    CANCELLED = "cancelled", "cancelled; the objects not reached were skipped"


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
    # Bulk jobs only: selected at the preview but not acted on (cancelled before they were
    # reached, or no longer matching the filter when their batch came).
    skipped = models.PositiveIntegerField(default=0)
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
            # staff member needs it (console/ops/figures.py, the /ops/ page and /metrics).
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
                    requested__gte=F("succeeded") + F("refused") + F("failed") + F("skipped"),
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
                        & Q(requested=F("succeeded") + F("refused") + F("failed") + F("skipped"))
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


# The receive view's ACK histogram buckets (ingress.receive.ACK_SECONDS), one column each, as
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

    Whoever reads a host's histogram for /metrics or /ops/ adds what it counted since its
    last reading (console/ops/ack_rollup.py, INSERT … ON CONFLICT DO UPDATE adding), so rows sum
    over hosts; the ops page charts p99 per hour from them. Kept 48 h.
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


class AckRollupMark(models.Model):
    """What one ACK histogram (a host's, for one run of its web server) had counted when it
    was last rolled up, per source and bucket: console/ops/ack_rollup.py adds only what it
    counted since, under this row's lock."""

    key = models.CharField(max_length=255, unique=True)
    counts = models.JSONField(default=dict)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        default_permissions = ()

    def __str__(self) -> str:
        return self.key


class BulkJobKind(models.TextChoices):
    REPLAY_RAW_EVENTS = "replay_raw_events", "replay raw events"
    REARM_DELIVERIES = "rearm_deliveries", "re-arm deliveries"
    REARM_SIDE_EFFECTS = "rearm_side_effects", "re-arm side effects"


class BulkJobState(models.TextChoices):
    PREVIEWED = "previewed", "previewed (not started)"
    QUEUED = "queued", "queued for a worker"
    RUNNING = "running", "running"
    CANCELLING = "cancelling", "cancelling (stops after the current batch)"
    CANCELLED = "cancelled", "cancelled"
    DONE = "done", "done"
    FAILED = "failed", "failed"


BULK_JOB_ACTIVE_STATES = (BulkJobState.QUEUED, BulkJobState.RUNNING, BulkJobState.CANCELLING)
BULK_JOB_FINAL_STATES = (BulkJobState.CANCELLED, BulkJobState.DONE, BulkJobState.FAILED)


class BulkJob(ActorRecord):
    """A replay or re-arm of any size, run by django-q2 in batches (console/jobs/services.py).

    The selection is either a filter (`filters`) over the rows with ids up to `upper_id`
    (what existed at the preview: rows arriving later are not part of what was previewed)
    or explicit `target_ids`. Batches walk it in id order; `cursor` is the last id whose
    batch committed, written in that batch's transaction, so a worker that dies resumes
    where the last batch ended and a second run of the same job does nothing twice.
    """

    kind = models.CharField(max_length=32, choices=BulkJobKind.choices)
    via = models.CharField(max_length=8, choices=OperatorActionVia.choices)
    filters = models.JSONField(default=dict, blank=True)
    target_ids = models.JSONField(default=list, blank=True)
    upper_id = models.BigIntegerField(default=0)
    state = models.CharField(
        max_length=16, choices=BulkJobState.choices, default=BulkJobState.PREVIEWED
    )
    # The preview: how many rows the selection held, and per source / type / status.
    total = models.PositiveIntegerField(default=0)
    breakdown = models.JSONField(default=dict, blank=True)
    cursor = models.BigIntegerField(default=0)
    batches = models.PositiveIntegerField(default=0)
    processed = models.PositiveIntegerField(default=0)
    succeeded = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    # The first refusals and errors (payload-free domain messages), for the detail page.
    problems = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    # The operator's click: the replay SLO is measured from here.
    started_at = models.DateTimeField(null=True, blank=True)
    # Written with every batch: a job whose heartbeat stops is resumed by the sweep.
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    operator_action = models.OneToOneField(
        OperatorAction, null=True, blank=True, on_delete=models.PROTECT, related_name="bulk_job"
    )
    # The replay SLO, measured once the window after the click has passed (replay and
    # delivery re-arm jobs): of the acted-on rows that have a handler to run, how many were
    # handled within BULK_JOB_REPLAY_SLO_SECONDS of the click, and the p99 of click -> handled
    # (NULL when more than 1 % were not handled by the time it was measured).
    slo_measured_at = models.DateTimeField(null=True, blank=True)
    slo_events = models.PositiveIntegerField(null=True, blank=True)
    slo_within = models.PositiveIntegerField(null=True, blank=True)
    slo_p99_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        # Jobs are operator actions: console.view_operatoraction reads them, console.operate
        # previews, starts and cancels them.
        default_permissions = ()
        indexes = [
            models.Index(fields=["-created_at"], name="bulkjob_created"),
            models.Index(
                fields=["heartbeat_at"],
                condition=Q(state__in=["queued", "running", "cancelling"]),
                name="bulkjob_active",
            ),
            models.Index(fields=["slo_measured_at"], name="bulkjob_slo_measured"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=BulkJobKind.values), name="bulkjob_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(via__in=OperatorActionVia.values), name="bulkjob_via_valid"
            ),
            models.CheckConstraint(
                condition=Q(state__in=BulkJobState.values), name="bulkjob_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(processed=F("succeeded") + F("refused") + F("failed")),
                name="bulkjob_counts_add_up",
            ),
            # Started exactly when it left the preview, finished exactly in a final state.
            models.CheckConstraint(
                condition=Q(state="previewed", started_at__isnull=True)
                | (~Q(state="previewed") & Q(started_at__isnull=False))
                | Q(state="cancelled", started_at__isnull=True),
                name="bulkjob_started_consistent",
            ),
            models.CheckConstraint(
                condition=Q(state__in=["cancelled", "done", "failed"], finished_at__isnull=False)
                | (~Q(state__in=["cancelled", "done", "failed"]) & Q(finished_at__isnull=True)),
                name="bulkjob_finished_consistent",
            ),
            models.CheckConstraint(
                condition=Q(slo_within__lte=F("slo_events")) | Q(slo_events__isnull=True),
                name="bulkjob_slo_within_events",
            ),
        ]

    def __str__(self) -> str:
        return f"bulk job #{self.pk} {self.get_kind_display()} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in BULK_JOB_ACTIVE_STATES

    @property
    def progress_percent(self) -> int:
        if self.state == BulkJobState.DONE:
            return 100
        if not self.total:
            return 0
        return min(100, round(100 * self.processed / self.total))


class BulkJobItem(models.Model):
    """One row a bulk job acted on successfully: what the replay SLO is measured over.

    Written in the batch's own transaction (unique per job, so a batch run twice adds
    nothing); pruned with the job's SLO window long past (console/jobs/services.py).
    """

    job = models.ForeignKey(BulkJob, on_delete=models.CASCADE, related_name="items")
    target_id = models.BigIntegerField()

    class Meta:
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["job", "target_id"], name="bulkjobitem_job_target")
        ]

    def __str__(self) -> str:
        return f"job #{self.job_id} row {self.target_id}"


class IncidentKind(models.TextChoices):
    DEAD_DELIVERIES = "dead_deliveries", "dead deliveries"
    DEAD_SIDE_EFFECTS = "dead_side_effects", "dead side effects"
    REJECTED_EVENTS = "rejected_events", "rejected events"
    STUCK_DELIVERIES = "stuck_deliveries", "stuck deliveries"
    STUCK_SIDE_EFFECTS = "stuck_side_effects", "stuck side effects"


class Incident(models.Model):
    """Who acknowledged and who resolved one group of failures, and when.

    The group itself — its rows, count, first and last seen — is a query over the failed rows
    (console/incidents/services.py), keyed by (kind, scope, error class): nothing here is kept
    in step with the rows. A row is written the first time an operator acknowledges or resolves the
    group, through console.incidents.services (recorded as an operator action). A failure newer than
    `resolved_at` reopens the group: that is read from the rows, not written.
    """

    kind = models.CharField(max_length=32, choices=IncidentKind.choices)
    # A handler, an effect type or a source, by kind.
    scope = models.CharField(max_length=255)
    error_class = models.CharField(max_length=255)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "scope", "error_class"], name="incident_one_per_group"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=IncidentKind.values), name="incident_kind_valid"
            ),
            # Acknowledged (resolved) exactly when someone is named as having done it.
            models.CheckConstraint(
                condition=Q(acknowledged_at__isnull=True, acknowledged_by="")
                | (Q(acknowledged_at__isnull=False) & ~Q(acknowledged_by="")),
                name="incident_acknowledged_by_someone",
            ),
            models.CheckConstraint(
                condition=Q(resolved_at__isnull=True, resolved_by="")
                | (Q(resolved_at__isnull=False) & ~Q(resolved_by="")),
                name="incident_resolved_by_someone",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()}: {self.scope} {self.error_class}"


class VolumeKind(models.TextChoices):
    # Raw events with a verdict, by the 5 minutes they were received in and their verdict now.
    EVENTS = "events", "raw events by receipt and verdict"
    # Verdicts given, by the minute they were given in.
    VERDICTS = "verdicts", "verdicts by minute"
    # Deliveries finished (done, dead, superseded), by the minute they finished in and handler.
    FINISHED = "finished", "deliveries finished by minute"


class VolumeBucket(models.Model):
    """Counts kept as rows change, for the ops page and /metrics: never a count over a day of
    the store per request.

    Written only by the database: statement triggers on the raw store and the deliveries
    (migration 0008) add each statement's changes, one row per writing connection (`shard`:
    its backend pid), so two writers never wait for each other's commit. Pending events are
    not counted here (the pending index counts them); rows older than 48 h are pruned by the
    console's minute sweep.
    """

    kind = models.CharField(max_length=16, choices=VolumeKind.choices)
    bucket = models.DateTimeField()
    # The raw event's source; for finished deliveries, their handler.
    source = models.CharField(max_length=255, blank=True, default="")
    status = models.CharField(max_length=16)
    reason = models.CharField(max_length=32, blank=True, default="")
    shard = models.IntegerField()
    rows = models.BigIntegerField()

    class Meta:
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "bucket", "source", "status", "reason", "shard"],
                name="volumebucket_one_row",
            )
        ]
        indexes = [models.Index(fields=["bucket"], name="volumebucket_bucket")]

    def __str__(self) -> str:
        return f"{self.kind} {self.bucket:%Y-%m-%d %H:%M} {self.source} {self.status}: {self.rows}"
