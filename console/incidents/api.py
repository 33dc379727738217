"""Incidents in the console API: failures grouped, acknowledged, resolved, re-armed.

GET  /api/incidents/                              console.view_ops
POST /api/incidents/{acknowledge,resolve,rearm}/  console.operate
"""

from collections.abc import Callable

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import (
    UNKNOWN_FILTER,
    ConsoleApi,
    OperatorActionOutputSerializer,
    operator_action_answer,
)
from console.incidents import services as incidents
from console.jobs.api import BulkJobOutputSerializer
from console.jobs.services import BulkJobError
from console.models import IncidentKind, OperatorAction, OperatorActionVia
from console.services import acting_user


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


class IncidentFilters(serializers.Serializer):
    state = serializers.ChoiceField(choices=incidents.STATES, required=False)
    kind = serializers.ChoiceField(choices=IncidentKind.choices, required=False)

    def validate(self, attrs: dict) -> dict:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: [UNKNOWN_FILTER] for name in unknown})
        return attrs


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
    """Acknowledge a failure group: someone is on it (POST {"kind", "scope", "error_class"})."""

    service = staticmethod(incidents.incident_acknowledge)


class IncidentResolveApi(IncidentChangeApi):
    """Resolve a failure group: the cause is fixed (POST {"kind", "scope", "error_class"})."""

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
