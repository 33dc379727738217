"""Incidents: failures grouped by what they have in common, acknowledged and resolved.

An operator meets 2,000 dead deliveries of one cause as one incident, not 2,000 rows. A
group is (kind, scope, error class):

- dead_deliveries: dead deliveries, by handler and the class before `:` in last_error;
- dead_side_effects: dead side effects, by effect type and last_error_class;
- rejected_events: events rejected, received in INCIDENT_WINDOW, by source and reason;
- stuck_deliveries: deliveries due longer than the processing SLO's red line, by handler and
  error class (`waiting`: no error yet);
- stuck_side_effects: side effects due longer than their red line, or left processing by a
  dead worker, by effect type and last_error_class.

Each group is one GROUP BY over the rows, on the partial indexes of dead and due rows (and,
for rejections, a received_at window that prunes the raw event partitions): count, first
and last seen, a sample row. Only the acknowledgement and resolution are stored (Incident,
one row per group, constraints in the database), each change an audited operator action.
A group resolved at T whose rows include one that failed after T is open again.

Re-arming a group of dead rows goes through the bulk job (console/bulk_jobs.py): the
group's ids are previewed as a job, which the operator then starts on its page.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Count, F, Func, Max, Min, Q, QuerySet, Value
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone

from console.bulk_jobs import MAX_SELECTED_IDS, bulk_job_preview
from console.models import (
    BulkJob,
    BulkJobKind,
    Incident,
    IncidentKind,
    ItemOutcome,
    OperatorAction,
    OperatorActionKind,
    OperatorActionOutcome,
)
from console.ops import SLOS
from eventdrop.errors import EventDropError
from ingress.models import Delivery, DeliveryStatus, RawEvent, SignatureStatus
from outbox.models import RecapSideEffect, SideEffectStatus

logger = logging.getLogger(__name__)

# Rejections older than this are history, not an incident; the window also bounds the scan
# of the raw event store to its last week of partitions.
INCIDENT_WINDOW = timedelta(days=7)
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


def _grouped(kind: str, now: datetime) -> list[dict]:
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
    stored = {(i.kind, i.scope, i.error_class): i for i in Incident.objects.filter(kind__in=kinds)}
    groups = []
    for name in kinds:
        for row in _grouped(name, now):
            key = (name, row["group_scope"], row["group_class"])
            groups.append(
                IncidentGroup(
                    kind=name,
                    scope=row["group_scope"],
                    error_class=row["group_class"],
                    rows=row["rows"],
                    first_seen=row["first"],
                    last_seen=row["last"],
                    sample_id=row["sample"],
                    incident=stored.get(key),
                )
            )
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


def _change(
    *,
    actor: User,
    via: str,
    action: str,
    kind: str,
    scope: str,
    error_class: str,
    apply: Callable[[Incident, IncidentGroup], str],
) -> OperatorAction:
    """Record the change as an operator action (written before, finished after, as
    console.services records every action), refused when the group has no rows now or is
    in the target state already."""
    record = OperatorAction.objects.create(
        actor=actor,
        actor_username=actor.get_username(),
        action=action,
        via=via,
        target_model=Incident._meta.label_lower,
        target_ids=[],
        requested=1,
        note=f"{kind}: {scope} {error_class}",
    )
    try:
        with transaction.atomic():
            group = incident_group_get(kind=kind, scope=scope, error_class=error_class)
            if group is None:
                verb = "resolve" if action == OperatorActionKind.INCIDENT_RESOLVE else "acknowledge"
                raise IncidentRefused(
                    NO_SUCH_INCIDENT.format(
                        kind=kind, scope=scope, error_class=error_class, verb=verb
                    )
                )
            incident, _ = Incident.objects.select_for_update().get_or_create(
                kind=kind, scope=scope, error_class=error_class
            )
            detail = apply(incident, group)
    except IncidentRefused as exc:
        record.refused = 1
        record.outcome = OperatorActionOutcome.REFUSED
        record.results = [{"outcome": ItemOutcome.REFUSED, "detail": str(exc)}]
    else:
        record.succeeded = 1
        record.outcome = OperatorActionOutcome.SUCCEEDED
        record.target_ids = [incident.pk]
        record.results = [{"id": incident.pk, "outcome": ItemOutcome.OK, "detail": detail}]
    record.finished_at = timezone.now()
    record.save(
        update_fields=["target_ids", "succeeded", "refused", "results", "outcome", "finished_at"]
    )
    logger.info(
        "console.operator_action",
        extra={
            "operator_action_id": record.id,
            "action": action,
            "via": via,
            "actor": record.actor_username,
            "outcome": record.outcome,
        },
    )
    return record


def incident_acknowledge(
    *, actor: User, via: str, kind: str, scope: str, error_class: str
) -> OperatorAction:
    """Someone is on it: the group shows as acknowledged, by whom, since when."""

    def apply(incident: Incident, group: IncidentGroup) -> str:
        if group.state == ACKNOWLEDGED:
            raise IncidentRefused(ALREADY.format(state=ACKNOWLEDGED))
        incident.acknowledged_at = timezone.now()
        incident.acknowledged_by = actor.get_username()
        incident.save(update_fields=["acknowledged_at", "acknowledged_by"])
        return ACKNOWLEDGED_DETAIL.format(
            kind=kind, scope=scope, error_class=error_class, rows=group.rows
        )

    return _change(
        actor=actor,
        via=via,
        action=OperatorActionKind.INCIDENT_ACKNOWLEDGE,
        kind=kind,
        scope=scope,
        error_class=error_class,
        apply=apply,
    )


def incident_resolve(
    *, actor: User, via: str, kind: str, scope: str, error_class: str
) -> OperatorAction:
    """The cause is fixed: the group shows as resolved until a row of it fails again."""

    def apply(incident: Incident, group: IncidentGroup) -> str:
        if group.state == RESOLVED:
            raise IncidentRefused(ALREADY.format(state=RESOLVED))
        # At least its newest failure: a row failing later reopens the group.
        incident.resolved_at = max(timezone.now(), group.last_seen)
        incident.resolved_by = actor.get_username()
        incident.save(update_fields=["resolved_at", "resolved_by"])
        return RESOLVED_DETAIL.format(
            kind=kind, scope=scope, error_class=error_class, rows=group.rows
        )

    return _change(
        actor=actor,
        via=via,
        action=OperatorActionKind.INCIDENT_RESOLVE,
        kind=kind,
        scope=scope,
        error_class=error_class,
        apply=apply,
    )


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
