"""Read access to everything the console shows: deliveries, side effects, recaps, with the
admin lists' filters, under the admin's permissions; the API root and the OpenAPI schema.

Lists are cursor-paginated (`limit`, then follow `next`): a cursor stays cheap however deep
a page is and does not skip or repeat rows while new ones arrive. `count` is given where it
is cheap: tables of one row per recap, per operator action or per job; deliveries only when
filtered to a status with its own partial index (every `done` delivery ever made is not
counted per page).

    GET /api/                                  the endpoints
    GET /api/schema/                           OpenAPI 3 (drf-spectacular), docs/openapi.json
    GET /api/deliveries/[<id>/]                ingress.view_delivery
    GET /api/side-effects/[<id>/]              outbox.view_recapsideeffect
    GET /api/recaps/[<uuid>/]                  recaps.view_recapvideo
    GET /api/incidents/                        console.view_ops (failure groups, their state)
    POST /api/incidents/{acknowledge,resolve,rearm}/   console.operate
"""

import uuid
from collections.abc import Callable
from datetime import timedelta

from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from console import incidents
from console.api_lists import FiltersSerializer, ListApi, in_window
from console.apis import (
    ConsoleApi,
    DeliveryAttemptOutputSerializer,
    OperatorActionOutputSerializer,
    ViewerErrorField,
    operator_action_answer,
)
from console.apis_jobs import BulkJobOutputSerializer
from console.bulk_jobs import BulkJobError
from console.models import (
    IncidentKind,
    OperatorAction,
    OperatorActionKind,
    OperatorActionOutcome,
    OperatorActionVia,
    PayloadAccessKind,
)
from console.presentation import error_for_viewer, may_read_payload
from console.selectors import operator_action_list
from console.services import acting_user, payload_access_record
from ingress.models import Delivery, DeliveryStatus, RawEvent
from outbox.models import (
    EffectType,
    RecapSideEffect,
    RecapSideEffectAttempt,
    SideEffectStatus,
)
from recaps.models import RecapStatus, RecapVideo

# A handler's error text may quote the payload (docs/security.md): a list shows its class
# only, to everyone, and a delivery's own page the text, to those who may read payloads, each
# time recorded (console.PayloadAccess). A raw event's hash and content-hash dedup key are
# kept to its payload the same way (console/apis.py).


# --- deliveries ------------------------------------------------------------------------------


class DeliveryRowSerializer(serializers.ModelSerializer):
    # The class only: a list is not recorded (DeliveryDetailSerializer shows the text).
    last_error: serializers.Field = serializers.SerializerMethodField()
    next_attempt_at = serializers.SerializerMethodField()

    class Meta:
        model = Delivery
        fields: tuple[str, ...] = (
            "id",
            "raw_event",
            "handler",
            "status",
            "attempts",
            "total_attempts",
            "next_attempt_at",
            "claimed_at",
            "created_at",
            "finished_at",
            "superseded_by",
            "last_error",
        )

    def get_last_error(self, obj: Delivery) -> str:
        return error_for_viewer(obj.last_error, may_read_payload=False)

    def get_next_attempt_at(self, obj: Delivery) -> str | None:
        # Kept on done and dead rows from their last attempt: only a pending one has one.
        if obj.status != DeliveryStatus.PENDING:
            return None
        return serializers.DateTimeField().to_representation(obj.next_attempt_at)


class DeliveryDetailSerializer(DeliveryRowSerializer):
    last_error = ViewerErrorField()
    history = DeliveryAttemptOutputSerializer(many=True)

    class Meta(DeliveryRowSerializer.Meta):
        fields = (*DeliveryRowSerializer.Meta.fields, "history")


class DeliveryFilters(FiltersSerializer):
    windows = ("created",)
    status = serializers.ChoiceField(choices=DeliveryStatus.choices, required=False)
    handler = serializers.CharField(required=False, max_length=255)
    # The stubs see Serializer.source in a field called `source` (see console/apis.py).
    source = serializers.CharField(required=False, max_length=64)  # type: ignore[assignment]
    raw_event = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)


# Statuses with a partial index of their own: counting them reads that index only.
COUNTED_DELIVERY_STATUSES = {
    DeliveryStatus.PENDING,
    DeliveryStatus.PROCESSING,
    DeliveryStatus.DEAD,
    DeliveryStatus.HELD,
    DeliveryStatus.SUPERSEDED,
}


class DeliveryListApi(ListApi):
    """The admin's delivery list: status, handler, source, created window, raw event."""

    required_permission = "ingress.view_delivery"
    filters = DeliveryFilters
    serializer = DeliveryRowSerializer

    def count_is_cheap(self, request: Request) -> bool:
        return request.query_params.get("status") in COUNTED_DELIVERY_STATUSES

    def rows(self, filters: dict) -> QuerySet:
        rows = Delivery.objects.all()
        for name in ("status", "handler"):
            if filters.get(name):
                rows = rows.filter(**{name: filters[name]})
        if filters.get("raw_event"):
            rows = rows.filter(raw_event_id=filters["raw_event"])
        if filters.get("source"):
            events = RawEvent.objects.filter(id=OuterRef("raw_event_id"), source=filters["source"])
            rows = rows.filter(Exists(events))
        return in_window(rows, "created_at", filters, "created")

    @extend_schema(parameters=[DeliveryFilters], responses=DeliveryRowSerializer(many=True))
    def get(self, request: Request) -> Response:
        return super().get(request)


class DeliveryDetailApi(ConsoleApi):
    required_permission = "ingress.view_delivery"

    @extend_schema(responses=DeliveryDetailSerializer)
    def get(self, request: Request, delivery_id: int) -> Response:
        delivery = get_object_or_404(
            Delivery.objects.prefetch_related("history"), pk=delivery_id
        )
        may_read = may_read_payload(request.user)
        errors = [delivery.last_error, *(attempt.error for attempt in delivery.history.all())]
        if may_read and any(errors):
            payload_access_record(
                actor=acting_user(request.user),
                kind=PayloadAccessKind.VIEW,
                via=OperatorActionVia.API,
                raw_event_ids=[delivery.raw_event_id],
            )
        context = {"may_read_payload": may_read}
        return Response(DeliveryDetailSerializer(delivery, context=context).data)


# --- recap side effects ----------------------------------------------------------------------


class SideEffectAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = RecapSideEffectAttempt
        fields = ("number", "outcome", "error_class", "error", "started_at", "finished_at")


class SideEffectRowSerializer(serializers.ModelSerializer):
    next_attempt_at = serializers.SerializerMethodField()

    class Meta:
        model = RecapSideEffect
        fields: tuple[str, ...] = (
            "id",
            "recap",
            "effect_type",
            "status",
            "attempts",
            "next_attempt_at",
            "claimed_at",
            "wait_reason",
            "last_error_class",
            "last_error",
            "created_at",
            "updated_at",
            "finished_at",
        )

    def get_next_attempt_at(self, obj: RecapSideEffect) -> str | None:
        # A processing row's next_attempt_at is its lease; done and dead rows keep their last.
        if obj.status != SideEffectStatus.PENDING:
            return None
        return serializers.DateTimeField().to_representation(obj.next_attempt_at)


class SideEffectDetailSerializer(SideEffectRowSerializer):
    history = SideEffectAttemptSerializer(many=True)

    class Meta(SideEffectRowSerializer.Meta):
        fields = (*SideEffectRowSerializer.Meta.fields, "history")


# The admin's "in this state for" filter (console/admin/outbox.py AgeFilter).
STATE_AGES = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "1d": timedelta(days=1)}


class SideEffectFilters(FiltersSerializer):
    windows = ("created",)
    status = serializers.ChoiceField(choices=SideEffectStatus.choices, required=False)
    last_error_class = serializers.CharField(required=False, max_length=64)
    attempts = serializers.RegexField(
        r"^\d{1,4}\+?$", required=False, help_text="n, or n+ for n or more"
    )
    state_age = serializers.ChoiceField(choices=sorted(STATE_AGES), required=False)
    effect_type = serializers.ChoiceField(choices=EffectType.choices, required=False)
    recap = serializers.UUIDField(required=False)
    created_after = serializers.DateTimeField(required=False)
    created_before = serializers.DateTimeField(required=False)


class SideEffectListApi(ListApi):
    """The admin's side effect list: status, error class, attempts, state age, effect type,
    created window, recap."""

    required_permission = "outbox.view_recapsideeffect"
    filters = SideEffectFilters
    serializer = SideEffectRowSerializer

    def rows(self, filters: dict) -> QuerySet:
        rows = RecapSideEffect.objects.all()
        for name in ("status", "last_error_class", "effect_type"):
            if filters.get(name):
                rows = rows.filter(**{name: filters[name]})
        if filters.get("recap"):
            rows = rows.filter(recap_id=filters["recap"])
        attempts = filters.get("attempts", "")
        if attempts.endswith("+"):
            rows = rows.filter(attempts__gte=int(attempts[:-1]))
        elif attempts:
            rows = rows.filter(attempts=int(attempts))
        if filters.get("state_age"):
            rows = rows.filter(updated_at__lt=timezone.now() - STATE_AGES[filters["state_age"]])
        return in_window(rows, "created_at", filters, "created")

    @extend_schema(parameters=[SideEffectFilters], responses=SideEffectRowSerializer(many=True))
    def get(self, request: Request) -> Response:
        return super().get(request)


class SideEffectDetailApi(ConsoleApi):
    required_permission = "outbox.view_recapsideeffect"

    @extend_schema(responses=SideEffectDetailSerializer)
    def get(self, request: Request, side_effect_id: int) -> Response:
        row = get_object_or_404(
            RecapSideEffect.objects.prefetch_related("history"), pk=side_effect_id
        )
        return Response(SideEffectDetailSerializer(row).data)


# --- recaps ----------------------------------------------------------------------------------


class RecapRowSerializer(serializers.ModelSerializer):
    buyer = serializers.CharField(source="buyer.username", read_only=True, allow_null=True)
    render_status = serializers.CharField(read_only=True, allow_null=True)

    class Meta:
        model = RecapVideo
        fields: tuple[str, ...] = (
            "id",
            "event",
            "status",
            "render_status",
            "is_free",
            "buyer",
            "payment_reference",
            "paid_at",
            "failure_reason",
            "created_at",
            "updated_at",
            "ready_at",
            "failed_at",
        )


class RecapDetailSerializer(RecapRowSerializer):
    side_effects = SideEffectRowSerializer(many=True)

    class Meta(RecapRowSerializer.Meta):
        fields = (
            *RecapRowSerializer.Meta.fields,
            "checkout_session_id",
            "render_id",
            "video_url",
            "rendering_at",
            "side_effects",
        )


class RecapFilters(FiltersSerializer):
    windows = ("paid", "updated")
    status = serializers.ChoiceField(choices=RecapStatus.choices, required=False)
    is_free = serializers.BooleanField(required=False, allow_null=True, default=None)
    paid_after = serializers.DateTimeField(required=False)
    paid_before = serializers.DateTimeField(required=False)
    updated_after = serializers.DateTimeField(required=False)
    updated_before = serializers.DateTimeField(required=False)
    q = serializers.CharField(
        required=False,
        max_length=255,
        help_text="recap id, payment reference, checkout session id or render id (exact)",
    )


def recaps_with_render_status() -> QuerySet[RecapVideo]:
    """Recaps with their render side effect's status, in the same query (as the admin)."""
    render_status = RecapSideEffect.objects.filter(
        recap=OuterRef("pk"), effect_type=EffectType.RENDER
    ).values("status")[:1]
    return RecapVideo.objects.select_related("buyer").annotate(
        render_status=Subquery(render_status)
    )


class RecapListApi(ListApi):
    """The admin's recap list: status, free or not, paid and updated windows, search."""

    required_permission = "recaps.view_recapvideo"
    filters = RecapFilters
    serializer = RecapRowSerializer
    ordering = ("-created_at", "-id")

    def rows(self, filters: dict) -> QuerySet:
        rows = recaps_with_render_status()
        if filters.get("status"):
            rows = rows.filter(status=filters["status"])
        if filters.get("is_free") is not None:
            rows = rows.filter(is_free=filters["is_free"])
        rows = in_window(rows, "paid_at", filters, "paid")
        rows = in_window(rows, "updated_at", filters, "updated")
        term = filters.get("q", "").strip()
        if term:
            try:
                rows = rows.filter(id=uuid.UUID(term))
            except ValueError:
                rows = rows.filter(
                    Q(payment_reference=term) | Q(checkout_session_id=term) | Q(render_id=term)
                )
        return rows

    @extend_schema(parameters=[RecapFilters], responses=RecapRowSerializer(many=True))
    def get(self, request: Request) -> Response:
        return super().get(request)


class RecapDetailApi(ConsoleApi):
    required_permission = "recaps.view_recapvideo"

    @extend_schema(responses=RecapDetailSerializer)
    def get(self, request: Request, recap_id: uuid.UUID) -> Response:
        recap = get_object_or_404(
            recaps_with_render_status().prefetch_related("side_effects"), pk=recap_id
        )
        return Response(RecapDetailSerializer(recap).data)


# --- the audit trail -------------------------------------------------------------------------


class OperatorActionFilters(FiltersSerializer):
    windows = ("started",)
    action = serializers.ChoiceField(choices=OperatorActionKind.choices, required=False)
    outcome = serializers.ChoiceField(choices=OperatorActionOutcome.choices, required=False)
    via = serializers.ChoiceField(choices=OperatorActionVia.choices, required=False)
    actor = serializers.CharField(required=False, max_length=150, help_text="username (exact)")
    started_after = serializers.DateTimeField(required=False)
    started_before = serializers.DateTimeField(required=False)


class OperatorActionListApi(ListApi):
    """The admin's audit trail: action, outcome, via, started window, username."""

    required_permission = "console.view_operatoraction"
    filters = OperatorActionFilters
    serializer = OperatorActionOutputSerializer
    ordering = ("-started_at", "-id")

    def rows(self, filters: dict) -> QuerySet:
        rows = operator_action_list()
        for name in ("action", "outcome", "via"):
            if filters.get(name):
                rows = rows.filter(**{name: filters[name]})
        if filters.get("actor"):
            rows = rows.filter(actor_username=filters["actor"])
        return in_window(rows, "started_at", filters, "started")

    @extend_schema(
        parameters=[OperatorActionFilters], responses=OperatorActionOutputSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        return super().get(request)


# --- the root --------------------------------------------------------------------------------

# (name in console/urls.py, what it is, the permission it needs); the root lists them all.
ENDPOINTS: tuple[tuple[str, str, str], ...] = (
    ("console:raw-event-list", "raw events (GET), filters as the admin's", "ingress.view_rawevent"),
    ("console:delivery-list", "deliveries (GET)", "ingress.view_delivery"),
    ("console:side-effect-list", "recap side effects (GET)", "outbox.view_recapsideeffect"),
    ("console:recap-list", "recaps (GET)", "recaps.view_recapvideo"),
    ("console:incident-list", "incidents: failures grouped (GET)", "console.view_ops"),
    ("console:queue-depths", "queue depths, drain rates, time to clear", "console.view_ops"),
    ("console:pause-list", "handler pauses (GET; POST pauses)", "console.view_ops"),
    ("console:bulk-job-list", "bulk jobs (GET; POST previews)", "console.view_operatoraction"),
    ("console:operator-action-list", "the audit trail", "console.view_operatoraction"),
    ("console:raw-event-replay", "replay raw events (POST)", "console.operate"),
    ("console:raw-event-reverify", "re-verify rejected events (POST)", "console.operate"),
    ("console:side-effect-rearm", "re-arm side effects (POST)", "console.operate"),
    ("console:side-effect-mark-dead", "give up on side effects (POST)", "console.operate"),
    ("console:recap-retry-render", "render recaps again (POST)", "console.operate"),
    ("console:schema", "this API as OpenAPI 3", ""),
)


class ApiRootApi(ConsoleApi):
    """Every endpoint, with what it needs and whether the caller has it."""

    def get_permissions(self) -> list:
        return [IsAdminUser()]

    @extend_schema(
        responses={
            200: {
                "type": "object",
                "properties": {
                    "endpoints": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "url": {"type": "string"},
                                "what": {"type": "string"},
                                "permission": {"type": "string"},
                                "allowed": {"type": "boolean"},
                            },
                        },
                    }
                },
            }
        }
    )
    def get(self, request: Request) -> Response:
        return Response(
            {
                "endpoints": [
                    {
                        "url": request.build_absolute_uri(reverse(name)),
                        "what": what,
                        "permission": permission,
                        "allowed": not permission or request.user.has_perm(permission),
                    }
                    for name, what, permission in ENDPOINTS
                ]
            }
        )


# --- incidents -------------------------------------------------------------------------------


class IncidentSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=IncidentKind.choices)
    scope = serializers.CharField()
    error_class = serializers.CharField()
    state = serializers.ChoiceField(choices=incidents.STATES)
    reopened = serializers.BooleanField()
    rows = serializers.IntegerField()
    first_seen = serializers.DateTimeField()
    last_seen = serializers.DateTimeField()
    sample_id = serializers.IntegerField()
    acknowledged_at = serializers.DateTimeField(source="incident.acknowledged_at", default=None)
    acknowledged_by = serializers.CharField(source="incident.acknowledged_by", default="")
    resolved_at = serializers.DateTimeField(source="incident.resolved_at", default=None)
    resolved_by = serializers.CharField(source="incident.resolved_by", default="")
    url = serializers.SerializerMethodField()

    def get_url(self, group: incidents.IncidentGroup) -> str:
        return self.context["request"].build_absolute_uri(group.url)


class IncidentFilters(FiltersSerializer):
    state = serializers.ChoiceField(choices=incidents.STATES, required=False)
    kind = serializers.ChoiceField(choices=IncidentKind.choices, required=False)


class IncidentKeySerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=IncidentKind.choices)
    scope = serializers.CharField(max_length=255)
    error_class = serializers.CharField(max_length=255)


class IncidentListApi(ConsoleApi):
    """Failure groups now, newest failure first (few: one per cause), each with its state."""

    required_permission = "console.view_ops"

    @extend_schema(
        parameters=[IncidentFilters],
        responses=inline_serializer(
            "IncidentList",
            {"count": serializers.IntegerField(), "results": IncidentSerializer(many=True)},
        ),
    )
    def get(self, request: Request) -> Response:
        filters = IncidentFilters(data=request.query_params)
        filters.is_valid(raise_exception=True)
        groups = incidents.incident_groups(**filters.validated_data)
        data = IncidentSerializer(groups, many=True, context={"request": request}).data
        return Response({"count": len(groups), "results": data})


class IncidentChangeApi(ConsoleApi):
    """POST {"kind", "scope", "error_class"}: the recorded operator action (a refusal: 409,
    the problem naming why, with the operator action that recorded it)."""

    required_permission = "console.operate"
    service: Callable[..., OperatorAction]

    @extend_schema(request=IncidentKeySerializer, responses=OperatorActionOutputSerializer)
    def post(self, request: Request) -> Response:
        key = IncidentKeySerializer(data=request.data)
        key.is_valid(raise_exception=True)
        record = type(self).service(
            actor=acting_user(request.user), via=OperatorActionVia.API, **key.validated_data
        )
        return operator_action_answer(record)


class IncidentAcknowledgeApi(IncidentChangeApi):
    service = staticmethod(incidents.incident_acknowledge)


class IncidentResolveApi(IncidentChangeApi):
    service = staticmethod(incidents.incident_resolve)


class IncidentRearmApi(ConsoleApi):
    """POST {"kind", "scope", "error_class"} -> 201, a previewed bulk job over the group's
    dead rows; start it with POST /api/jobs/<id>/start/."""

    required_permission = "console.operate"

    @extend_schema(request=IncidentKeySerializer, responses={201: BulkJobOutputSerializer})
    def post(self, request: Request) -> Response:
        key = IncidentKeySerializer(data=request.data)
        key.is_valid(raise_exception=True)
        try:
            job = incidents.incident_rearm_preview(
                actor=acting_user(request.user), via=OperatorActionVia.API, **key.validated_data
            )
        except (incidents.IncidentRefused, BulkJobError) as exc:
            raise serializers.ValidationError({"kind": [str(exc)]}) from exc
        return Response(BulkJobOutputSerializer(job).data, status=201)
