"""The console API for bulk jobs: preview, start, cancel, status. JSON only.

The same gatekeeping as every console endpoint (console.api.ConsoleApi: staff, same-site
writes, one named permission): reading jobs needs `console.view_operatoraction` (a job is
an operator action), previewing, starting and cancelling `console.operate`.

    POST /api/jobs/                  {"kind", "filters": {...}} or {"kind", "ids": [...]}
                                     -> 201, the previewed job (count and breakdown)
    GET  /api/jobs/                  the newest jobs first (limit, then the cursor in next)
    GET  /api/jobs/<id>/             state, progress, counts, the replay SLO once measured
    POST /api/jobs/<id>/start/       -> 202, queued
    POST /api/jobs/<id>/cancel/      -> 202, cancelling (or cancelled, for a preview)
"""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import MAX_ID, ConsoleApi, ConsoleFilterSet, ListApi, choice
from console.jobs.services import (
    MAX_SELECTED_IDS,
    READ_PERMISSION,
    STATUSES_PER_KIND,
    WRITE_PERMISSION,
    BulkJobError,
    bulk_job_cancel,
    bulk_job_list,
    bulk_job_preview,
    bulk_job_start,
)
from console.models import BulkJob, BulkJobKind, BulkJobState, OperatorActionVia
from console.services import acting_user
from ingress.models import DeliveryStatus, RejectionReason, SignatureStatus

NOT_A_STATUS = "Not a status of {kind}; one of: {statuses}."


class JobsApi(ConsoleApi):
    # Reads need the audit trail's permission (a job is an operator action).
    required_permission = READ_PERMISSION
    write_permission = WRITE_PERMISSION


class BulkJobFiltersSerializer(serializers.Serializer):
    """Every filter any kind takes; console.jobs.services refuses those that do not apply."""

    # The stubs type Serializer.source (a field's attribute path) and cannot tell a field
    # called `source` from it; the API's filter is named after the webhook source.
    source = serializers.CharField(required=False, max_length=64)  # type: ignore[assignment]
    event_type = serializers.CharField(required=False, max_length=255)
    # The row's own status: a raw event's signature status, a delivery's or side effect's.
    status = serializers.ChoiceField(
        choices=sorted({*SignatureStatus.values, *DeliveryStatus.values}), required=False
    )
    # A raw event's rejection reason; the class a delivery's last error starts with; a side
    # effect's last error class.
    reason = serializers.CharField(required=False, max_length=255)
    received_after = serializers.DateTimeField(required=False)
    received_before = serializers.DateTimeField(required=False)
    handler = serializers.CharField(required=False, max_length=255)
    delivery_status = serializers.ChoiceField(choices=DeliveryStatus.choices, required=False)

    def to_internal_value(self, data):
        # A misspelt filter must not quietly select every row.
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown filter."] for name in unknown})
        return super().to_internal_value(data)


class LengthFirstListField(serializers.ListField):
    """A ListField that refuses an over-long list before validating its items: DRF checks
    max_length only after every item, so a million ids cost a million validations (and an
    error listing the bad ones) before the one answer that matters, "too many"."""

    def to_internal_value(self, data):
        if self.max_length is not None and isinstance(data, list) and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


class BulkJobInputSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=BulkJobKind.choices)
    filters = BulkJobFiltersSerializer(required=False, default=dict)
    ids = LengthFirstListField(
        child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
        required=False,
        allow_empty=False,
        max_length=MAX_SELECTED_IDS,
    )

    def validate(self, attrs):
        status_filter = attrs.get("filters", {}).get("status")
        statuses = STATUSES_PER_KIND[attrs["kind"]]
        if status_filter and status_filter not in statuses:
            # Else a raw event's status on deliveries (say) selects nothing, said as "empty".
            raise serializers.ValidationError(
                {
                    "filters": {
                        "status": [
                            NOT_A_STATUS.format(kind=attrs["kind"], statuses=", ".join(statuses))
                        ]
                    }
                }
            )
        reason = attrs.get("filters", {}).get("reason")
        if (
            attrs["kind"] == BulkJobKind.REPLAY_RAW_EVENTS
            and reason
            and reason not in RejectionReason.values
        ):
            raise serializers.ValidationError({"filters": {"reason": ["Not a rejection reason."]}})
        if attrs.get("ids") and attrs.get("filters"):
            raise serializers.ValidationError({"ids": ["Give ids or filters, not both."]})
        return attrs


class BulkJobOutputSerializer(serializers.ModelSerializer):
    progress_percent = serializers.IntegerField()
    operator_action_id = serializers.IntegerField(allow_null=True)
    selected_by = serializers.SerializerMethodField()

    class Meta:
        model = BulkJob
        fields = (
            "id",
            "kind",
            "state",
            "actor_username",
            "via",
            "selected_by",
            "filters",
            "total",
            "breakdown",
            "batches",
            "processed",
            "succeeded",
            "refused",
            "failed",
            "progress_percent",
            "problems",
            "error",
            "created_at",
            "started_at",
            "heartbeat_at",
            "finished_at",
            "operator_action_id",
            "slo_measured_at",
            "slo_events",
            "slo_within",
            "slo_p99_seconds",
        )

    def get_selected_by(self, job: BulkJob) -> str:
        # The ids themselves can be 100,000: the status answer says how, not which.
        return "ids" if job.target_ids else "filters"


def _job_response(job: BulkJob, code: int = status.HTTP_200_OK) -> Response:
    return Response(BulkJobOutputSerializer(job).data, status=code)


def _refused(exc: BulkJobError) -> serializers.ValidationError:
    # Nothing was done; the field that was wrong, with the service's constant message.
    return serializers.ValidationError({exc.field: [str(exc)]})


class BulkJobFilter(ConsoleFilterSet):
    kind = choice(BulkJobKind.choices)
    state = choice(BulkJobState.choices)


class BulkJobListApi(JobsApi, ListApi):
    """Bulk jobs, newest first, by kind and state (GET); preview one: a count and a breakdown,
    nothing touched (POST {"kind", "filters"} or {"kind", "ids"})."""

    filterset_class = BulkJobFilter
    serializer_class = BulkJobOutputSerializer
    ordering = ("-created_at", "-id")

    def get_queryset(self):
        return bulk_job_list()

    @extend_schema(request=BulkJobInputSerializer, responses={201: BulkJobOutputSerializer})
    def post(self, request: Request) -> Response:
        serializer = BulkJobInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            job = bulk_job_preview(
                actor=acting_user(request.user),
                kind=data["kind"],
                via=OperatorActionVia.API,
                filters={} if data.get("ids") else dict(data.get("filters") or {}),
                target_ids=data.get("ids", ()),
            )
        except BulkJobError as exc:
            raise _refused(exc) from exc
        return _job_response(job, status.HTTP_201_CREATED)


class BulkJobDetailApi(JobsApi):
    """A job: state, progress, counts, the replay SLO once measured."""

    @extend_schema(responses=BulkJobOutputSerializer)
    def get(self, request: Request, job_id: int) -> Response:
        return _job_response(get_object_or_404(bulk_job_list(), pk=job_id))


class BulkJobStartApi(JobsApi):
    """Start a previewed job: queued for a worker, in batches (POST)."""

    @extend_schema(request=None, responses={202: BulkJobOutputSerializer})
    def post(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(BulkJob, pk=job_id)
        try:
            job = bulk_job_start(
                job=job, actor=acting_user(request.user), via=OperatorActionVia.API
            )
        except BulkJobError as exc:
            raise _refused(exc) from exc
        return _job_response(job, status.HTTP_202_ACCEPTED)


class BulkJobCancelApi(JobsApi):
    """Cancel a job after its batch in flight (a preview is discarded) (POST)."""

    @extend_schema(request=None, responses={202: BulkJobOutputSerializer})
    def post(self, request: Request, job_id: int) -> Response:
        job = get_object_or_404(BulkJob, pk=job_id)
        try:
            job = bulk_job_cancel(job=job, actor=acting_user(request.user))
        except BulkJobError as exc:
            raise _refused(exc) from exc
        return _job_response(job, status.HTTP_202_ACCEPTED)
