"""Incidents: failures grouped by what they have in common, acknowledged and resolved.

An operator meets 2,000 dead deliveries of one cause as one incident, not 2,000 rows. A
group is (kind, scope, error class):

- dead_deliveries: dead deliveries, by handler and the class before `:` in last_error;
- dead_side_effects: dead side effects, by effect type and last_error_class;
- rejected_events: events rejected, received in the last 24 h, by source and reason;
- stuck_deliveries: deliveries due longer than the processing SLO's red line, by handler and
  error class (`waiting`: no error yet);
- stuck_side_effects: side effects due longer than their red line, or left processing by a
  dead worker, by effect type and last_error_class.

Each group is one GROUP BY over the rows, on the partial indexes of dead and due rows (and,
for rejections, a received_at window that prunes the raw event partitions): count, first
and last seen, a sample row. Only the acknowledgement and resolution are stored (Incident,
one row per group, constraints in the database), each change an audited operator action.
A group resolved at T whose rows include one that failed after T is open again.

Re-arming a group of dead rows goes through the bulk job (console/jobs/services.py): the
group's ids are previewed as a job, which the operator then starts on its page.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Count, F, Func, Max, Min, Q, QuerySet, Value
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone

from console.jobs.services import MAX_SELECTED_IDS, bulk_job_preview
from console.models import (
    BulkJob,
    BulkJobKind,
    Incident,
    IncidentKind,
    OperatorAction,
    OperatorActionKind,
    VolumeBucket,
)
from console.ops.figures import SLOS, bucket_floor
from console.services import operator_action_one
from ingress.models import Delivery, DeliveryStatus, RawEvent, SignatureStatus
from kernel.errors import EventDropError
from outbox.models import RecapSideEffect, SideEffectStatus

# Rejections older than this are history, not an incident (the list and the ops page's
# "Verification failures, last 24 h" keep them). The window also bounds the scan: no index
# serves rejected rows, so the group reads every row of the window's one or two partitions
# (docs/console.md, "Incidents", for its cost).
INCIDENT_WINDOW = timedelta(hours=24)
NO_ERROR = "waiting"  # a stuck row that has not failed yet

OPEN = "open"
ACKNOWLEDGED = "acknowledged"
RESOLVED = "resolved"
STATES = (OPEN, ACKNOWLEDGED, RESOLVED)

NO_SUCH_INCIDENT = "No {kind} of {scope} with {error_class} now: nothing to {verb}."
ALREADY = "The incident is already {state}."
NOT_REARMABLE = "Only dead deliveries and dead side effects are re-armed; {kind} are not."
ACKNOWLEDGED_DETAIL = "acknowledged {kind}: {scope} {error_class} ({rows} rows)"
RESOLVED_DETAIL = "resolved {kind}: {scope} {error_class} ({rows} rows)"


class IncidentRefused(EventDropError):
    pass


class HandlerErrorClass(Func):
    """The exception class a stored handler error starts with (`Class: message`), or
    'error' when it does not start with one — the same reading as
    console.presentation.error_for_viewer, in SQL, so a group is one GROUP BY."""

    template = (
        "CASE WHEN %(expressions)s ~ '^[A-Za-z_][A-Za-z0-9_.]{0,200}:' "
        "THEN split_part(%(expressions)s, ':', 1) "
        "WHEN %(expressions)s = '' THEN '" + NO_ERROR + "' ELSE 'error' END"
    )


@dataclass(frozen=True)
class IncidentGroup:
    kind: str
    scope: str
    error_class: str
    rows: int
    first_seen: datetime
    last_seen: datetime
    sample_id: int
    incident: Incident | None = None

    @property
    def state(self) -> str:
        incident = self.incident
        if incident is None:
            return OPEN
        if incident.resolved_at is not None and self.last_seen <= incident.resolved_at:
            return RESOLVED
        acknowledged = incident.acknowledged_at
        if acknowledged is not None and (
            incident.resolved_at is None or acknowledged > incident.resolved_at
        ):
            return ACKNOWLEDGED
        return OPEN

    @property
    def reopened(self) -> bool:
        return self.state == OPEN and self.incident is not None and bool(self.incident.resolved_at)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.scope, self.error_class)

    @property
    def url(self) -> str:
        return incident_url(*self.key)

    @property
    def kind_label(self) -> str:
        return IncidentKind(self.kind).label

    @property
    def rearmable(self) -> bool:
        return IncidentKind(self.kind) in REARM_JOB_KINDS

    @property
    def sample_url(self) -> str:
        admin_url = SAMPLE_ADMIN[IncidentKind(self.kind)]
        return reverse(admin_url, args=[self.sample_id])


def incident_url(kind: str, scope: str, error_class: str) -> str:
    return reverse("console-incident", args=[kind, scope, error_class])


REARM_JOB_KINDS = {
    IncidentKind.DEAD_DELIVERIES: BulkJobKind.REARM_DELIVERIES,
    IncidentKind.DEAD_SIDE_EFFECTS: BulkJobKind.REARM_SIDE_EFFECTS,
}
SAMPLE_ADMIN = {
    IncidentKind.DEAD_DELIVERIES: "admin:ingress_delivery_change",
    IncidentKind.STUCK_DELIVERIES: "admin:ingress_delivery_change",
    IncidentKind.DEAD_SIDE_EFFECTS: "admin:outbox_recapsideeffect_change",
    IncidentKind.STUCK_SIDE_EFFECTS: "admin:outbox_recapsideeffect_change",
    IncidentKind.REJECTED_EVENTS: "admin:ingress_rawevent_change",
}


@dataclass(frozen=True)
class GroupQuery:
    """One kind's failed rows, and how they are grouped and timed."""

    rows: Callable[[datetime], QuerySet]
    scope: str  # field
    error_class: Callable[[], object]  # an expression
    seen: Callable[[], object]  # the failure's time, an expression


def _stuck_deliveries(now: datetime) -> QuerySet:
    due_before = now - timedelta(seconds=SLOS["deliveries_oldest_due_age"].red_at)
    return Delivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=due_before)


def _stuck_side_effects(now: datetime) -> QuerySet:
    due_before = now - timedelta(seconds=SLOS["side_effects_oldest_due_age"].red_at)
    stale_before = now - timedelta(seconds=settings.OUTBOX_STALE_PROCESSING_SECONDS)
    return RecapSideEffect.objects.filter(
        Q(status=SideEffectStatus.PENDING, next_attempt_at__lte=due_before)
        | Q(status=SideEffectStatus.PROCESSING, claimed_at__lt=stale_before)
    )


def _side_effect_class() -> Coalesce:
    return Coalesce(Func(F("last_error_class"), Value(""), function="NULLIF"), Value(NO_ERROR))


GROUPS: dict[str, GroupQuery] = {
    IncidentKind.DEAD_DELIVERIES: GroupQuery(
        rows=lambda now: Delivery.objects.filter(status=DeliveryStatus.DEAD),
        scope="handler",
        error_class=lambda: HandlerErrorClass(F("last_error")),
        seen=lambda: Coalesce(F("finished_at"), F("created_at")),
    ),
    IncidentKind.DEAD_SIDE_EFFECTS: GroupQuery(
        rows=lambda now: RecapSideEffect.objects.filter(status=SideEffectStatus.DEAD),
        scope="effect_type",
        error_class=_side_effect_class,
        seen=lambda: Coalesce(F("finished_at"), F("updated_at")),
    ),
    IncidentKind.REJECTED_EVENTS: GroupQuery(
        # Closed at both ends: the scan prunes to the window's partitions.
        rows=lambda now: RawEvent.objects.filter(
            signature_status=SignatureStatus.REJECTED,
            received_at__gte=now - INCIDENT_WINDOW,
            received_at__lte=now,
        ),
        scope="source",
        error_class=lambda: F("rejection_reason"),
        seen=lambda: Coalesce(F("verified_at"), F("received_at")),
    ),
    IncidentKind.STUCK_DELIVERIES: GroupQuery(
        rows=_stuck_deliveries,
        scope="handler",
        error_class=lambda: HandlerErrorClass(F("last_error")),
        seen=lambda: F("next_attempt_at"),
    ),
    IncidentKind.STUCK_SIDE_EFFECTS: GroupQuery(
        rows=_stuck_side_effects,
        scope="effect_type",
        error_class=_side_effect_class,
        seen=lambda: F("next_attempt_at"),
    ),
}


# Rejections per (source, reason) as the database counts them (console.models.VolumeBucket),
# each group's first and newest row read from the rejected rows' index: bounded by the number
# of groups, not by how many events were rejected.
REJECTED_GROUPS = """
SELECT g.source, g.reason, g.rows, f.seen, l.seen, l.id
FROM (SELECT source, reason, sum(rows) AS rows FROM {buckets}
      WHERE kind = 'events' AND status = 'rejected' AND bucket >= %(since)s AND bucket <= %(now)s
      GROUP BY source, reason HAVING sum(rows) > 0) AS g
CROSS JOIN LATERAL (
    SELECT coalesce(r.verified_at, r.received_at) AS seen FROM {events} AS r
    WHERE r.signature_status = 'rejected' AND r.rejection_reason = g.reason
      AND r.source = g.source AND r.received_at >= %(since)s AND r.received_at <= %(now)s
    ORDER BY r.received_at LIMIT 1) AS f
CROSS JOIN LATERAL (
    SELECT coalesce(r.verified_at, r.received_at) AS seen, r.id FROM {events} AS r
    WHERE r.signature_status = 'rejected' AND r.rejection_reason = g.reason
      AND r.source = g.source AND r.received_at >= %(since)s AND r.received_at <= %(now)s
    ORDER BY r.received_at DESC LIMIT 1) AS l
"""


def _rejected_groups(now: datetime) -> list[dict]:
    since = bucket_floor(now - INCIDENT_WINDOW)
    sql = REJECTED_GROUPS.format(
        buckets=VolumeBucket._meta.db_table, events=RawEvent._meta.db_table
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, {"since": since, "now": now})
        names = ("group_scope", "group_class", "rows", "first", "last", "sample")
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _grouped(kind: str, now: datetime) -> list[dict]:
    if kind == IncidentKind.REJECTED_EVENTS:
        return _rejected_groups(now)
    query = GROUPS[kind]
    return list(
        query.rows(now)
        .annotate(group_scope=F(query.scope), group_class=query.error_class(), seen=query.seen())
        .values("group_scope", "group_class")
        .annotate(rows=Count("id"), first=Min("seen"), last=Max("seen"), sample=Min("id"))
        .order_by()
    )


def incident_groups(
    *, kind: str = "", now: datetime | None = None, state: str = ""
) -> list[IncidentGroup]:
    """Every group of failures now (of one kind, or every kind), newest failure first,
    each with its acknowledgement and resolution; `state` keeps one state only."""
    now = now or timezone.now()
    kinds = [kind] if kind else list(GROUPS)
    found = [(name, row) for name in kinds for row in _grouped(name, now)]
    # Their acknowledgements, read only when there is a group to show them on.
    stored = {}
    if found:
        incidents = Incident.objects.filter(kind__in=kinds)
        stored = {(i.kind, i.scope, i.error_class): i for i in incidents}
    groups = [
        IncidentGroup(
            kind=name,
            scope=row["group_scope"],
            error_class=row["group_class"],
            rows=row["rows"],
            first_seen=row["first"],
            last_seen=row["last"],
            sample_id=row["sample"],
            incident=stored.get((name, row["group_scope"], row["group_class"])),
        )
        for name, row in found
    ]
    groups.sort(key=lambda group: group.last_seen, reverse=True)
    return [group for group in groups if not state or group.state == state]


def incident_group_get(*, kind: str, scope: str, error_class: str) -> IncidentGroup | None:
    for group in incident_groups(kind=kind):
        if (group.scope, group.error_class) == (scope, error_class):
            return group
    return None


def incident_row_ids(group: IncidentGroup, *, limit: int = MAX_SELECTED_IDS) -> list[int]:
    """The ids of the group's rows now, oldest first (for its bulk job)."""
    query = GROUPS[group.kind]
    rows = (
        query.rows(timezone.now())
        .annotate(group_class=query.error_class())
        .filter(**{query.scope: group.scope}, group_class=group.error_class)
        .order_by("id")
        .values_list("id", flat=True)
    )
    return list(rows[:limit])


# --- acknowledge, resolve, re-arm -------------------------------------------------------------


# The two changes of an incident's state: (the state it moves to, the Incident fields it
# sets, the detail recorded).
CHANGES = {
    OperatorActionKind.INCIDENT_ACKNOWLEDGE: (ACKNOWLEDGED, "acknowledged", ACKNOWLEDGED_DETAIL),
    OperatorActionKind.INCIDENT_RESOLVE: (RESOLVED, "resolved", RESOLVED_DETAIL),
}


def incident_change(
    *, actor: User, via: str, action: str, kind: str, scope: str, error_class: str
) -> OperatorAction:
    """Move a group to the action's state, recorded as an operator action; refused when the
    group has no rows now or is in that state already."""
    state, field, template = CHANGES[OperatorActionKind(action)]

    @transaction.atomic
    def change() -> tuple[int, str, dict]:
        group = incident_group_get(kind=kind, scope=scope, error_class=error_class)
        if group is None:
            raise IncidentRefused(
                NO_SUCH_INCIDENT.format(
                    kind=kind, scope=scope, error_class=error_class, verb=field[:-1]
                )
            )
        if group.state == state:
            raise IncidentRefused(ALREADY.format(state=state))
        incident, _ = Incident.objects.select_for_update().get_or_create(
            kind=kind, scope=scope, error_class=error_class
        )
        # A resolution is at least as late as the group's newest failure: a row failing
        # after it reopens the group.
        at = timezone.now() if state == ACKNOWLEDGED else max(timezone.now(), group.last_seen)
        setattr(incident, f"{field}_at", at)
        setattr(incident, f"{field}_by", actor.get_username())
        incident.save(update_fields=[f"{field}_at", f"{field}_by"])
        detail = template.format(kind=kind, scope=scope, error_class=error_class, rows=group.rows)
        return incident.pk, detail, {}

    return operator_action_one(
        actor=actor,
        via=via,
        action=action,
        target_model=Incident._meta.label_lower,
        note=f"{kind}: {scope} {error_class}",
        change=change,
    )


# Acknowledge: someone is on it (shown with who and since when). Resolve: the cause is fixed
# (shown until a row of the group fails again). Both keyword-only: actor, via, kind, scope,
# error_class.
incident_acknowledge = partial(incident_change, action=OperatorActionKind.INCIDENT_ACKNOWLEDGE)
incident_resolve = partial(incident_change, action=OperatorActionKind.INCIDENT_RESOLVE)


def incident_rearm_preview(
    *, actor: User, via: str, kind: str, scope: str, error_class: str
) -> BulkJob:
    """A previewed bulk job over the group's dead rows (started on the job's page)."""
    if IncidentKind(kind) not in REARM_JOB_KINDS:
        raise IncidentRefused(NOT_REARMABLE.format(kind=kind))
    group = incident_group_get(kind=kind, scope=scope, error_class=error_class)
    if group is None:
        raise IncidentRefused(
            NO_SUCH_INCIDENT.format(kind=kind, scope=scope, error_class=error_class, verb="re-arm")
        )
    return bulk_job_preview(
        actor=actor,
        kind=REARM_JOB_KINDS[IncidentKind(kind)],
        via=via,
        target_ids=incident_row_ids(group),
    )
