"""The raw event store, the dedup index and the per-handler deliveries.

On PostgreSQL `ingress_rawevent` is partitioned by day on `received_at` (see migration 0001
for the SQL). A partitioned table cannot carry a unique constraint or a primary key that
leaves out the partition key, so the table's real primary key is (id, received_at) while
Django treats `id` as the key; ids stay unique because they come from one identity sequence.
For the same reason foreign keys *into* the raw store are declared with
`db_constraint=False`: PostgreSQL cannot point a foreign key at `id` alone.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from kernel.queue import Claim, WorkItem


class SignatureStatus(models.TextChoices):
    PENDING = "pending", "pending"
    VERIFIED = "verified", "verified"
    REJECTED = "rejected", "rejected"
    # Signed, but its signature covers the body only and an earlier event of another
    # delivery id carried the same one: the same thing happening twice, or a captured request
    # sent again. Neither handled nor rejected until the provider's delivery log or an
    # operator answers its SignatureQuestion (ingress/signature_replays.py).
    QUESTIONED = "questioned", "questioned (signature seen before)"


class RejectionReason(models.TextChoices):
    """The closed set of reasons a stored event can be rejected for."""

    MISSING_SIGNATURE = "missing_signature", "signature header missing"
    MALFORMED_HEADER = "malformed_header", "signature or timestamp header malformed"
    NO_MATCHING_SCHEME = "no_matching_scheme", "no signature in a scheme we check"
    BAD_SIGNATURE = "bad_signature", "signature does not match any secret"
    STALE_TIMESTAMP = "stale_timestamp", "timestamp older than the tolerance"
    FUTURE_TIMESTAMP = "future_timestamp", "timestamp further ahead than the tolerance"
    UNPARSEABLE_BODY = "unparseable_body", "body is not the JSON the provider sends"
    NO_SECRET_CONFIGURED = "no_secret_configured", "the source has no secret configured"
    UNKNOWN_SOURCE = "unknown_source", "the source is no longer configured"
    VERIFIER_ERROR = "verifier_error", "the verifier failed unexpectedly (a bug; re-verify)"
    # Signed and parseable, but its JSON holds text a PostgreSQL text column cannot hold
    # (an escaped NUL, a lone surrogate): no handler could store what it says.
    UNSTORABLE_TEXT = "unstorable_text", "body holds text PostgreSQL cannot store"
    # Settling the row raised INBOX_MAX_ROW_FAILURES times (a bug in our code, or a poison
    # row nothing else caught): set aside, with the error on the row; re-verify once fixed.
    PROCESSING_FAILED = "processing_failed", "processing raised repeatedly (a bug; re-verify)"
    # Signed, but its signature covers the body only (GitHub, generic HMAC) and an earlier
    # request carried the same one under another delivery id: a captured request sent again
    # (ingress/signature_replays.py). Never dispatched.
    REPLAYED_SIGNATURE = (
        "replayed_signature",
        "signature seen before, and the provider never sent this delivery",
    )
    # Its worker died INBOX_MAX_WORKER_DEATHS times in a row while settling it, every time
    # but the first with this row alone in its batch (killed, out of memory, a crash in a
    # verifier): set aside, with the count on the row; re-verify hands it back to the worker.
    WORKER_DIED = "worker_died", "its worker died repeatedly settling it (re-verify)"


class DispatchStatus(models.TextChoices):
    """What happened after verification (set in the same transaction)."""

    WAITING = "waiting", "waiting for verification"
    DISPATCHED = "dispatched", "deliveries created"
    NO_HANDLER = "no_handler", "no handler registered"
    DUPLICATE = "duplicate", "duplicate of an earlier event"
    NOT_DISPATCHED = "not_dispatched", "rejected, never dispatched"


class RawEventOrigin(models.TextChoices):
    """How a raw event got into the store (set on insert, never changed)."""

    RECEIVED = "received", "received (a webhook request)"
    # Fetched by a reconciliation run from the provider's API over TLS with our API key,
    # because the webhook never reached us: there is no signature, and the inbox treats the
    # fetch itself as the proof of origin (ingress/reconcile/verdict.py).
    BACKFILLED = "backfilled", "backfilled (fetched from the provider's API)"
    # Read back from an archive after its partition was dropped (ingress/archive.py): for
    # search and an operator's replay, never settled or delivered on its own.
    RESTORED = "restored", "restored (from an archive past retention)"


def current_region() -> str:
    return settings.EVENTDROP_REGION


class RawEvent(models.Model):
    id = models.BigAutoField(primary_key=True)
    # What was received, exactly.
    source = models.CharField(max_length=64)
    provider = models.CharField(max_length=32)
    method = models.CharField(max_length=16)
    path = models.TextField()
    query_string = models.TextField(blank=True, default="")
    headers = models.JSONField(default=dict)
    body = models.BinaryField()
    # How `body` is stored: "" as received, else "fernet:<key fingerprint>" (encrypted at
    # rest, ingress/encryption.py; read it with ingress.payloads.raw_event_body). db_default
    # for the same reasons as `origin` below: catalog-only on the partitions, and INSERTs
    # from code that predates the column store plaintext, which is what they wrote.
    body_encryption = models.CharField(max_length=32, blank=True, default="", db_default="")
    # Of the plaintext, encrypted or not: dedup and forensics compare what was received.
    body_sha256 = models.CharField(max_length=64)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    delivery_id = models.CharField(max_length=255, blank=True, default="")

    # Verification (Flow 2, step 1).
    signature_status = models.CharField(
        max_length=16, choices=SignatureStatus.choices, default=SignatureStatus.PENDING
    )
    rejection_reason = models.CharField(
        max_length=32, choices=RejectionReason.choices, blank=True, default=""
    )
    matched_secret_index = models.SmallIntegerField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    verify_count = models.PositiveIntegerField(default=0)
    event_type = models.CharField(max_length=255, blank=True, default="")
    # Slack's fast redeliveries announce themselves; recorded, never used to drop an event.
    provider_retry_num = models.PositiveSmallIntegerField(null=True, blank=True)
    provider_retry_reason = models.CharField(max_length=64, blank=True, default="")

    # Dedup and dispatch (Flow 2, steps 2-3).
    dedup_key = models.CharField(max_length=300, blank=True, default="")
    duplicate_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="duplicates",
    )
    dispatch_status = models.CharField(
        max_length=16, choices=DispatchStatus.choices, default=DispatchStatus.WAITING
    )
    # All deliveries of this event finished (done or dead): verified -> handled lag.
    handled_at = models.DateTimeField(null=True, blank=True)
    # Settling this row (verify, dedup, fan-out) raised: how often, the last error (its class
    # and where, never its message, which may quote the payload) and when the row may be
    # claimed again. After INBOX_MAX_ROW_FAILURES it is rejected `processing_failed`.
    # db_default for the same reasons as `origin` below (catalog-only on the partitions);
    # not Positive…, whose CHECK would scan every partition under an exclusive lock.
    processing_failures = models.SmallIntegerField(default=0, db_default=0)
    processing_error = models.CharField(max_length=255, blank=True, default="", db_default="")
    retry_not_before = models.DateTimeField(null=True, blank=True)
    # Only ingress/reconcile/services.py writes anything but `received`: the receive path
    # cannot, so no sender can claim an unsigned event was fetched by us. db_default keeps
    # INSERTs from code that predates the column working during a rolling deploy, and makes
    # the column a catalog-only change on the partitioned table (no rewrite). No check
    # constraint: Django adds one validated at once, scanning every partition under a lock
    # that blocks webhook INSERTs meanwhile.
    origin = models.CharField(
        max_length=16,
        choices=RawEventOrigin.choices,
        default=RawEventOrigin.RECEIVED,
        db_default=RawEventOrigin.RECEIVED,
    )
    # When a restore wrote this row (origin `restored`): such rows are kept
    # RAW_EVENT_RESTORED_RETENTION_DAYS from then, and never archived again. Nullable, no
    # default: a catalog-only column on the partitions.
    restored_at = models.DateTimeField(null=True, blank=True)
    # Rejected on its first verification past its source's cap on rejected payload bytes per
    # minute (ingress/rejected_payloads.py): its body and headers were dropped, and this says
    # how many bytes they were (0: kept). The row's other columns stay. db_default and not
    # Positive…, as `processing_failures` above.
    payload_dropped_bytes = models.IntegerField(default=0, db_default=0)
    # The region that received the request (EVENTDROP_REGION; empty with one region). Each
    # region publishes the rows it received, filtered on this column (docs/multi-region.md);
    # db_default keeps the column catalog-only on the partitioned table, and INSERTs from
    # code that predates it working during a rolling deploy.
    region = models.CharField(max_length=32, default=current_region, db_default="")
    # The receive span's W3C traceparent (kernel/tracing.py; "" when tracing is off): the
    # inbox's verify span starts under it, however much later. db_default as `region`.
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")

    class Meta:
        indexes = [
            models.Index(fields=["source", "delivery_id"], name="rawevent_source_delivery"),
            models.Index(fields=["received_at"], name="rawevent_received_at"),
            # The inbox's claim goes round the sources, oldest first within each.
            models.Index(
                fields=["source", "received_at"],
                condition=Q(signature_status="pending"),
                name="rawevent_pending_source",
            ),
            # Rows waiting on a question are few: lists, figures and retention find them here.
            models.Index(
                fields=["received_at"],
                condition=Q(signature_status="questioned"),
                name="rawevent_questioned",
            ),
            models.Index(fields=["dedup_key"], name="rawevent_dedup_key"),
            # The console's filters and searches, each served by an index so that a list
            # costs its page at any size of the store (docs/console.md, "What a page costs").
            models.Index(
                fields=["received_at"],
                condition=Q(signature_status="rejected"),
                name="rawevent_rejected",
            ),
            models.Index(
                fields=["rejection_reason", "received_at"],
                condition=Q(signature_status="rejected"),
                name="rawevent_rejected_reason",
            ),
            models.Index(
                fields=["dispatch_status", "received_at"],
                condition=Q(dispatch_status__in=["no_handler", "duplicate", "not_dispatched"]),
                name="rawevent_undispatched",
            ),
            models.Index(
                fields=["origin", "received_at"],
                condition=~Q(origin="received"),
                name="rawevent_origin",
            ),
            models.Index(fields=["source", "received_at"], name="rawevent_source_received"),
            models.Index(
                fields=["event_type", "received_at"],
                condition=~Q(event_type=""),
                name="rawevent_event_type",
            ),
            models.Index(
                fields=["delivery_id"], condition=~Q(delivery_id=""), name="rawevent_delivery_id"
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(signature_status__in=SignatureStatus.values),
                name="rawevent_signature_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(dispatch_status__in=DispatchStatus.values),
                name="rawevent_dispatch_status_valid",
            ),
            # A rejection always says why, and only rejections carry a reason.
            models.CheckConstraint(
                condition=(
                    Q(signature_status="rejected") & ~Q(rejection_reason="")
                    | ~Q(signature_status="rejected") & Q(rejection_reason="")
                ),
                name="rawevent_rejection_has_reason",
            ),
        ]
        permissions = [("view_raw_payload", "Can view raw webhook payloads (body and headers)")]

    def __str__(self) -> str:
        return f"{self.source} #{self.id} ({self.signature_status})"


class RawEventClaimStatus(models.TextChoices):
    PENDING = "pending", "due again (given back, or its holder gone)"
    PROCESSING = "processing", "claimed by a worker"


class RawEventClaim(WorkItem):
    """A pending raw event's claim by an inbox worker (ingress/inbox.py), a row of the one
    queue (kernel/queue.py): from its first claim until the transaction that settles the
    event deletes it. `worker_deaths` counts the holders that died with it.

    A table of its own rather than columns of the raw event: the claim is committed before
    the batch is settled, and a second UPDATE of every raw event (a wide row, five indexes)
    cost the drain about a fifth of its CPU (docs/benchmarks.md).
    """

    # The event's id as the row's `id`: the one queue's statements key on it.
    raw_event = models.OneToOneField(
        RawEvent,
        primary_key=True,
        db_column="id",
        on_delete=models.DO_NOTHING,
        db_constraint=False,  # the raw store is partitioned (see the module docstring)
        related_name="+",
    )
    status = models.CharField(
        max_length=16,
        choices=RawEventClaimStatus.choices,
        default=RawEventClaimStatus.PROCESSING,
        db_default=RawEventClaimStatus.PROCESSING,
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=RawEventClaimStatus.values),
                name="raweventclaim_status_valid",
            ),
            *WorkItem.queue_constraints("raweventclaim"),
        ]

    def __str__(self) -> str:
        return f"claim of raw event #{self.raw_event_id} ({self.worker_deaths} deaths)"


class DedupKey(models.Model):
    """One row per distinct event per source: the unique index decides who is first."""

    source = models.CharField(max_length=64)
    key = models.CharField(max_length=300)
    raw_event = models.ForeignKey(
        RawEvent, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "key"], name="dedupkey_source_key_unique")
        ]
        indexes = [models.Index(fields=["created_at"], name="dedupkey_created_at")]

    def __str__(self) -> str:
        return f"{self.source}:{self.key}"


class SignatureAnswer(models.TextChoices):
    OPEN = "", "not answered yet"
    # The provider's delivery log lists this delivery (or an operator says it was sent):
    # verified, deduplicated on its delivery id and handled as usual.
    GENUINE = "genuine", "genuine (the provider sent it)"
    # The provider's delivery log, read over the whole window in which it would list it,
    # does not (or an operator says so): rejected `replayed_signature`.
    REPLAYED = "replayed", "replayed (the provider never sent it)"


class SignatureQuestion(models.Model):
    """Whether a `questioned` raw event was really sent by its provider: its body-only
    signature was first carried by `repeats`, under another delivery id.

    Written by ingress/signature_replays.py when the inbox questions the event, answered
    once (ingress.services.signature_question_answer, fenced on the event still being
    `questioned`): by the provider's delivery log (ingress/reconcile/signature_questions.py)
    or an operator. The answer stays, so settling the event again (a re-verify) gives the
    same verdict. Deleted with its event (ingress/partitions.py).
    """

    raw_event = models.OneToOneField(
        RawEvent,
        primary_key=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,  # the raw store is partitioned (see the module docstring)
        related_name="+",
    )
    # The event's, copied: the provider is asked about a delivery id, over a window of time,
    # without reading the raw store; received_at also finds the event's partition.
    source = models.CharField(max_length=64)
    delivery_id = models.CharField(max_length=255, blank=True, default="")
    received_at = models.DateTimeField()
    # The event that first carried the signature; an id that may dangle after its retention.
    repeats = models.ForeignKey(
        RawEvent,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    asked_at = models.DateTimeField(default=timezone.now)
    answer = models.CharField(
        max_length=16, choices=SignatureAnswer.choices, blank=True, default=SignatureAnswer.OPEN
    )
    answered_at = models.DateTimeField(null=True, blank=True)
    # "github" (its delivery log) or the operator's username.
    answered_by = models.CharField(max_length=150, blank=True, default="")
    # What decided it, or, while open, what the provider said last and when it is asked again.
    evidence = models.TextField(blank=True, default="")
    checked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(answer__in=SignatureAnswer.values),
                name="signaturequestion_answer_valid",
            ),
            models.CheckConstraint(
                condition=(
                    Q(answer="", answered_at__isnull=True)
                    | ~Q(answer="") & Q(answered_at__isnull=False) & ~Q(answered_by="")
                ),
                name="signaturequestion_answered_when_answer",
            ),
        ]
        indexes = [
            models.Index(
                fields=["source", "received_at"],
                condition=Q(answer=""),
                name="signaturequestion_open",
            )
        ]

    def __str__(self) -> str:
        return f"signature question of raw event #{self.raw_event_id} ({self.answer or 'open'})"


class RejectedPayloadMinute(models.Model):
    """The payload bytes (body and headers) kept of first-time rejected requests, per source
    and minute of arrival, against INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE; and what was
    dropped past it. Written by ingress/rejected_payloads.py only, under a row lock; kept
    RAW_EVENT_REJECTED_RETENTION_DAYS, as the rows it accounts for."""

    source = models.CharField(max_length=64)
    minute = models.DateTimeField()
    kept_bytes = models.BigIntegerField(default=0)
    dropped = models.IntegerField(default=0)
    dropped_bytes = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "minute"], name="rejectedpayload_one_row"),
            models.CheckConstraint(
                condition=Q(kept_bytes__gte=0, dropped__gte=0, dropped_bytes__gte=0),
                name="rejectedpayload_counts_not_negative",
            ),
        ]
        indexes = [models.Index(fields=["minute"], name="rejectedpayload_minute")]

    def __str__(self) -> str:
        return f"{self.source} {self.minute:%Y-%m-%d %H:%M}: {self.dropped} dropped"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "pending"
    PROCESSING = "processing", "processing"
    DONE = "done", "done"
    DEAD = "dead", "dead"
    # Its handler (or its event's source) is paused (HandlerPause): never claimed, never
    # charged an attempt; resuming turns it back to `pending`, in received order.
    HELD = "held", "held (handler paused)"
    # Its handler orders by a key (ingress/handlers.py) and a newer event of the same key was
    # already handled: not run, finished, with `superseded_by`; a forced replay runs it.
    SUPERSEDED = "superseded", "superseded (a newer event of its key was handled)"


# Not finished: the event is not handled yet and its partition is kept past retention.
UNFINISHED_DELIVERY_STATUSES = (
    DeliveryStatus.PENDING,
    DeliveryStatus.PROCESSING,
    DeliveryStatus.HELD,
)


class DeliveryClaim(Claim):
    """A claimed delivery: its event and handler, and its attempt's number in the history."""

    @property
    def raw_event_id(self) -> int:
        return int(self.row["raw_event_id"])

    @property
    def handler(self) -> str:
        return str(self.row["handler"])

    @property
    def number(self) -> int:
        return int(self.row["total_attempts"])

    @property
    def traceparent(self) -> str:
        return str(self.row.get("traceparent") or "")


class Delivery(WorkItem):
    """One verified event handed to one handler; the one queue's row (kernel/queue.py)."""

    raw_event = models.ForeignKey(
        RawEvent, on_delete=models.DO_NOTHING, db_constraint=False, related_name="deliveries"
    )
    handler = models.CharField(max_length=255)
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    # Never reset, unlike `attempts`: numbers the history.
    total_attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    # No updated_at: every write of a delivery is a QuerySet.update() (claims and outcomes in
    # bulk, fenced), which auto_now never moves; claimed_at and finished_at say when it ran.
    # Ordered handlers only (HandlerSpec.ordering_key): the key's value in this event, and
    # the provider's event time (the received time when the handler declares none, or the
    # payload lacks it). "" = unordered, claimed as any delivery. Set once, at creation.
    ordering_key = models.CharField(max_length=255, blank=True, default="", db_default="")
    event_time = models.DateTimeField(null=True, blank=True)
    # A superseded delivery: the handled delivery of a newer event of its key that it lost
    # to. An id, deliberately not a constraint: the newer event can be the older partition's
    # (an older event arriving late is the point), and retention deletes a day's deliveries
    # in raw SQL (ingress/partitions.py) — an ON DELETE SET NULL would make every such
    # delete probe this column (an index on the inbox's hot INSERT) and write rows of other
    # days. So it may dangle after retention: show it as an id, look it up, never assume it.
    superseded_by = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        # No index: it would take an entry for every delivery's NULL, on the inbox's hot
        # INSERT, to serve a lookup nobody makes in bulk.
        db_index=False,
        related_name="superseded",
    )
    # Replayed by force: runs even though a newer event of its key was handled.
    forced = models.BooleanField(default=False, db_default=False)
    # The verify span's traceparent (kernel/tracing.py): each attempt's span starts under
    # it, so retries are follow-up spans of the webhook's trace. "" when tracing is off.
    traceparent = models.CharField(max_length=55, blank=True, default="", db_default="")

    fair_by = "handler"
    claim_also = {"total_attempts": "t.total_attempts + 1"}
    claim_returns = ("raw_event_id", "handler", "total_attempts", "traceparent")
    claim_class = DeliveryClaim

    class Meta:
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["raw_event", "handler"], name="delivery_event_handler_unique"
            ),
            models.CheckConstraint(
                condition=Q(status__in=DeliveryStatus.values), name="delivery_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status="processing") | Q(claimed_at__isnull=False),
                name="delivery_processing_has_claim",
            ),
            models.CheckConstraint(
                condition=Q(ordering_key="") | Q(event_time__isnull=False),
                name="delivery_ordered_has_event_time",
            ),
            models.CheckConstraint(
                condition=~Q(status="superseded") | Q(finished_at__isnull=False),
                name="delivery_superseded_is_finished",
            ),
        ]
        indexes = [
            # The claim goes round the handlers, the longest due first within each.
            models.Index(
                fields=["handler", "next_attempt_at"],
                condition=Q(status="pending"),
                name="delivery_due_handler",
            ),
            models.Index(
                fields=["claimed_at"],
                condition=Q(status="processing"),
                name="delivery_processing",
            ),
            # Dead deliveries are few and looked for often (ops page, metrics, console).
            models.Index(fields=["finished_at"], condition=Q(status="dead"), name="delivery_dead"),
            # A pause's held count, and its release on resume in received order.
            models.Index(
                fields=["handler", "raw_event"], condition=Q(status="held"), name="delivery_held"
            ),
            # The head of each key (its oldest unfinished delivery, held ones included) and
            # whether one is running; and the newest handled one of a key, which an older one
            # is superseded by.
            models.Index(
                fields=["handler", "ordering_key", "event_time", "raw_event"],
                condition=~Q(ordering_key="") & Q(status__in=["pending", "processing", "held"]),
                name="delivery_key_unfinished",
            ),
            models.Index(
                fields=["handler", "ordering_key", "event_time", "raw_event"],
                condition=~Q(ordering_key="") & Q(status="done"),
                name="delivery_key_done",
            ),
            models.Index(
                fields=["finished_at"], condition=Q(status="superseded"), name="delivery_superseded"
            ),
            # The console's handler filter, newest first (docs/console.md).
            models.Index(fields=["handler", "id"], name="delivery_handler"),
        ]

    def __str__(self) -> str:
        return f"delivery #{self.pk} {self.handler} ({self.status})"


class HandlerPause(models.Model):
    """An operator's pause of one handler, or of every handler of one source (issue 13).

    While a pause is active (resumed_at NULL) events keep being received, stored, verified
    and deduplicated; the deliveries it covers are `held` instead of run (ingress/deliveries/
    holds any it finds due), and resuming releases them in received order at
    INBOX_RESUME_RELEASE_PER_SECOND. Written by ingress.services.handler_pause/handler_resume
    only; the console records who did it (an operator action). Rows are kept after resume: a
    pause's history (how long, how many deliveries it held) stays readable.
    """

    handler = models.CharField(max_length=255, blank=True, default="")  # a handler's name
    source = models.CharField(max_length=64, blank=True, default="")  # or a source's
    paused_at = models.DateTimeField(default=timezone.now)
    resumed_at = models.DateTimeField(null=True, blank=True)
    released = models.PositiveIntegerField(default=0)  # deliveries released on resume

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(handler="") & ~Q(source="")) | (~Q(handler="") & Q(source="")),
                name="handlerpause_one_scope",
            ),
            models.UniqueConstraint(
                fields=["handler", "source"],
                condition=Q(resumed_at__isnull=True),
                name="handlerpause_one_active_per_scope",
            ),
            models.CheckConstraint(
                condition=Q(resumed_at__isnull=True) | Q(resumed_at__gte=models.F("paused_at")),
                name="handlerpause_resumed_after_paused",
            ),
        ]

    def __str__(self) -> str:
        state = "active" if self.resumed_at is None else "resumed"
        return f"pause of {self.scope} ({state})"

    @property
    def scope(self) -> str:
        return f"handler {self.handler}" if self.handler else f"source {self.source}"


class HandlerPace(models.Model):
    """A handler's pace across every worker (ingress/deliveries/pace.py): the tokens of its
    declared rate, and the slow-down a downstream asked for. One row a limited handler, or a
    handler a downstream slowed; written by the claim and by a 429's release, never by hand."""

    handler = models.CharField(max_length=255, primary_key=True)
    # The rate's token bucket: what is left, as of refilled_at (which a slow-down moves to the
    # end of its pause).
    tokens = models.FloatField(default=0.0)
    refilled_at = models.DateTimeField(default=timezone.now)
    # A downstream's 429 or Retry-After: nothing claimed before not_before; the rate times
    # `factor` until slowed_until.
    not_before = models.DateTimeField(null=True, blank=True)
    factor = models.FloatField(default=1.0)
    slowed_until = models.DateTimeField(null=True, blank=True)
    rate_limited = models.BigIntegerField(default=0)  # slow-downs since the row was made

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(tokens__gte=0) & Q(factor__gt=0) & Q(factor__lte=1),
                name="handlerpace_bounds",
            ),
        ]

    def __str__(self) -> str:
        return f"pace of {self.handler}"


class DeliveryAttempt(models.Model):
    """History: one row per run of a handler, so the console shows every attempt."""

    class Outcome(models.TextChoices):
        DONE = "done", "done"
        TRANSIENT = "transient", "transient error (will retry)"
        RELEASED = "released", "not about this delivery, e.g. our database (not counted)"
        PERMANENT = "permanent", "permanent error"
        DEAD = "dead", "gave up after the last attempt"

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="history")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    error = models.TextField(blank=True, default="")
    # What a handler said it did when that is not the obvious, e.g. "stale callback for
    # render …" (ingress/handlers.py): our code's sentence with identifiers in it (a render
    # id), never a payload's free text, so the console shows it to every viewer.
    note = models.CharField(max_length=500, blank=True, default="", db_default="")

    class Meta:
        ordering = ["delivery_id", "number"]
        indexes = [models.Index(fields=["delivery", "number"], name="attempt_delivery_number")]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery #{self.delivery_id}: {self.outcome}"


class ReconciliationStatus(models.TextChoices):
    RUNNING = "running", "running"
    COMPLETE = "complete", "complete (the whole window was compared)"
    INCOMPLETE = "incomplete", "incomplete (stopped early; counts cover what was compared)"
    FAILED = "failed", "failed (could not compare)"


class ReconciliationRun(models.Model):
    """One comparison of a provider's own list of events with our dedup index, and its drift.

    Written by ingress/reconcile/services.py only: started `running`, counters updated after
    every page (a run killed mid-way still shows how far it got), finished once. `drift` is
    missing / provider_count over what was compared, measured *before* any repair, so it says
    how much the ingress lost; NULL while running and for failed runs, which compared nothing
    worth a figure. The seed's SLO: below 0.01 % (RECONCILE_DRIFT_SLO).
    """

    provider = models.CharField(max_length=32)
    source = models.CharField(max_length=64)
    # What at the provider was listed beyond the source, e.g. "repo acme/app hook 123".
    scope = models.CharField(max_length=255, blank=True, default="")
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(
        max_length=16, choices=ReconciliationStatus.choices, default=ReconciliationStatus.RUNNING
    )
    pages = models.PositiveIntegerField(default=0)
    # Distinct events (Stripe) or deliveries by GUID (GitHub) the provider listed in the window.
    provider_count = models.PositiveIntegerField(default=0)
    known_count = models.PositiveIntegerField(default=0)  # in the dedup index
    pending_count = models.PositiveIntegerField(default=0)  # stored, waiting for verification
    missing_count = models.PositiveIntegerField(default=0)
    backfilled_count = models.PositiveIntegerField(default=0)  # Stripe: fetched and stored
    redelivered_count = models.PositiveIntegerField(default=0)  # GitHub: redelivery requested
    drift = models.FloatField(null=True, blank=True)
    # The provider's ids of the missing events (the first few hundred; see services).
    missing_ids = models.JSONField(default=list, blank=True)
    notes = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=ReconciliationStatus.values),
                name="reconciliationrun_status_valid",
            ),
            # One run at a time per thing reconciled; a crashed run is marked failed by the
            # next start once it is older than its budget allows (see services).
            models.UniqueConstraint(
                fields=["provider", "source", "scope"],
                condition=Q(status="running"),
                name="reconciliationrun_one_running",
            ),
            models.CheckConstraint(
                condition=Q(window_start__lt=models.F("window_end")),
                name="reconciliationrun_window_ordered",
            ),
            models.CheckConstraint(
                condition=Q(
                    provider_count=models.F("known_count")
                    + models.F("pending_count")
                    + models.F("missing_count")
                ),
                name="reconciliationrun_counts_add_up",
            ),
            models.CheckConstraint(
                condition=Q(
                    missing_count__gte=models.F("backfilled_count") + models.F("redelivered_count")
                ),
                name="reconciliationrun_repairs_within_missing",
            ),
            models.CheckConstraint(
                condition=(
                    Q(status="running", finished_at__isnull=True)
                    | ~Q(status="running") & Q(finished_at__isnull=False)
                ),
                name="reconciliationrun_finished_when_done",
            ),
            models.CheckConstraint(
                condition=(
                    Q(status__in=["complete", "incomplete"], drift__gte=0, drift__lte=1)
                    | Q(status__in=["running", "failed"], drift__isnull=True)
                ),
                name="reconciliationrun_drift_when_compared",
            ),
            models.CheckConstraint(
                condition=~Q(status="failed") | ~Q(error=""),
                name="reconciliationrun_failure_has_error",
            ),
        ]
        indexes = [
            models.Index(
                fields=["provider", "source", "-started_at"], name="reconrun_provider_started"
            )
        ]

    def __str__(self) -> str:
        return f"{self.provider} reconciliation #{self.pk} ({self.status})"
