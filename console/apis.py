"""The console's JSON API: the same reads and operator actions as the admin, same rules.

Staff only (IsAdminUser) plus the admin's own permissions, checked per endpoint: reading raw
events needs `ingress.view_rawevent`, bodies and headers `ingress.view_raw_payload`, queue
depths `console.view_ops`, the audit trail `console.view_operatoraction`, and every action
`console.operate`. Bad input is a 4xx with the field that was wrong.

No other site can drive it (console/authentication.py for the credentials): writes accept
only JSON (a form post, the one thing a page elsewhere can send without CORS, is a 415), and
a write whose `Origin` or `Sec-Fetch-Site` says it comes from another site is a 403 whatever
its credentials.
"""


from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.permissions import BasePermission, IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.models import (
    OperatorAction,
    OperatorActionKind,
    OperatorActionVia,
    PayloadAccessKind,
)
from console.ops import queue_drains
from console.presentation import body_for_api, error_for_viewer, may_read_payload, seconds_between
from console.selectors import (
    BODY_SEARCH_ENCRYPTED,
    PAYLOAD_FIELDS,
    queue_depths,
    raw_event_deliveries,
    raw_event_list,
    raw_event_search,
    search_terms,
)
from console.services import (
    BULK_LIMIT,
    OPERATOR_ACTIONS,
    OperatorActionError,
    acting_user,
    payload_access_record,
)
from ingress.encryption import BodyUndecryptable, bodies_may_be_encrypted
from ingress.models import (
    Delivery,
    DeliveryAttempt,
    DispatchStatus,
    RawEvent,
    RejectionReason,
    SignatureStatus,
)
from ingress.payloads import raw_event_body, raw_event_headers
from ingress.providers import is_content_hash_key
from kernel.api_access import BoundedJSONParser, SameSiteWrites
from kernel.problems import problem

BODY_SEARCH_FORBIDDEN = "Searching body text needs the permission ingress.view_raw_payload."
PAYLOAD_FORBIDDEN = "Including bodies and headers needs the permission ingress.view_raw_payload."
CONTENT_HASH_FORBIDDEN = (
    "A dedup key made from a body's hash is looked up only with the permission "
    "ingress.view_raw_payload."
)
PAGINATION_PARAMS = {"limit", "offset"}
# PostgreSQL bigint: a larger id is bad input, not a database error.
MAX_ID = 2**63 - 1


# Bounds of a page request: beyond them PostgreSQL's LIMIT/OFFSET (bigint) overflowed into
# a 500 ("bigint out of range") for ?limit= or ?offset= of 20 digits.
MAX_PAGE_LIMIT = 1000
MAX_PAGE_OFFSET = 1_000_000_000
OFFSET_TOO_LARGE = "Ensure this value is less than or equal to {limit}; narrow the filters instead."


class ConsolePagination(LimitOffsetPagination):
    """limit/offset as DRF has them (a limit above MAX_PAGE_LIMIT is capped to it, as DRF
    caps at max_limit), with an offset past MAX_PAGE_OFFSET refused with a 400."""

    max_limit = MAX_PAGE_LIMIT

    def get_offset(self, request):
        offset = super().get_offset(request)
        if offset > MAX_PAGE_OFFSET:
            raise serializers.ValidationError(
                {self.offset_query_param: [OFFSET_TOO_LARGE.format(limit=MAX_PAGE_OFFSET)]}
            )
        return offset


class UncountedLimitOffsetPagination(ConsolePagination):
    """limit/offset without the COUNT(*): on a store of months of webhooks a count of every
    matching row costs more than the page itself. `next` is set when one more row exists."""

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        limit = self.get_limit(request)
        assert limit is not None  # REST_FRAMEWORK["PAGE_SIZE"] is the default limit
        offset = self.get_offset(request)
        self.limit, self.offset = limit, offset
        rows = list(queryset[offset : offset + limit + 1])
        # What the parent's link arithmetic needs of a count: whether a row lies beyond.
        self.count = offset + len(rows)
        return rows[:limit]

    def get_paginated_response(self, data):
        return Response(
            {"next": self.get_next_link(), "previous": self.get_previous_link(), "results": data}
        )

    def get_paginated_response_schema(self, schema):
        response = super().get_paginated_response_schema(schema)
        del response["properties"]["count"]
        response["required"] = ["next", "previous", "results"]
        return response


def has_perm(permission: str) -> type[BasePermission]:
    class HasPermission(BasePermission):
        message = f"This needs the permission {permission}."

        def has_permission(self, request, view):
            return request.user.has_perm(permission)

    return HasPermission


class ConsoleApi(APIView):
    """Every console endpoint: staff, same-site writes, and the one permission it names."""

    required_permission = ""
    parser_classes = [BoundedJSONParser]

    def get_permissions(self):
        return [IsAdminUser(), SameSiteWrites(), has_perm(self.required_permission)()]


class IdsInputSerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
        allow_empty=False,
        max_length=BULK_LIMIT,
    )


class MarkDeadInputSerializer(IdsInputSerializer):
    reason = serializers.CharField(max_length=1000, trim_whitespace=True)


class RecapIdsInputSerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=serializers.UUIDField(), allow_empty=False, max_length=BULK_LIMIT
    )


class OperatorActionOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = OperatorAction
        fields = (
            "id",
            "actor_username",
            "action",
            "via",
            "target_model",
            "target_ids",
            "requested",
            "succeeded",
            "refused",
            "failed",
            "outcome",
            "results",
            "note",
            "started_at",
            "finished_at",
        )


class RawEventOutputSerializer(serializers.ModelSerializer):
    # The row keeps one verdict time; a rejection's is returned as rejected_at, never as
    # verified_at (a rejected event was never verified).
    rejected_at = serializers.DateTimeField(source="verified_at", allow_null=True, read_only=True)
    # A content-hash key confirms a guessed body, as body_sha256 does: both only with the
    # payload (RawEventWithPayloadOutputSerializer, audited); a provider's event id here.
    dedup_key = serializers.SerializerMethodField()
    verify_lag_seconds = serializers.SerializerMethodField()
    handle_lag_seconds = serializers.SerializerMethodField()

    class Meta:
        model = RawEvent
        fields: tuple[str, ...] = (
            "id",
            "source",
            "provider",
            "event_type",
            "method",
            "path",
            "query_string",
            "remote_addr",
            "received_at",
            "delivery_id",
            "payload_dropped_bytes",
            "signature_status",
            "rejection_reason",
            "matched_secret_index",
            "verified_at",
            "rejected_at",
            "verify_count",
            "provider_retry_num",
            "provider_retry_reason",
            "dedup_key",
            "duplicate_of",
            "dispatch_status",
            "handled_at",
            "verify_lag_seconds",
            "handle_lag_seconds",
        )

    def to_representation(self, instance: RawEvent) -> dict:
        data = super().to_representation(instance)
        if instance.signature_status != SignatureStatus.VERIFIED:
            data["verified_at"] = None
        if instance.signature_status != SignatureStatus.REJECTED:
            data["rejected_at"] = None
        return data

    def get_dedup_key(self, obj: RawEvent) -> str | None:
        return None if is_content_hash_key(obj.dedup_key) else obj.dedup_key

    def get_verify_lag_seconds(self, obj: RawEvent) -> float | None:
        return seconds_between(obj.received_at, obj.verified_at)

    def get_handle_lag_seconds(self, obj: RawEvent) -> float | None:
        return seconds_between(obj.verified_at, obj.handled_at)


class RawEventWithPayloadOutputSerializer(RawEventOutputSerializer):
    headers = serializers.SerializerMethodField()
    body = serializers.SerializerMethodField()

    class Meta(RawEventOutputSerializer.Meta):
        fields = (*RawEventOutputSerializer.Meta.fields, "body_sha256", "headers", "body")

    def get_dedup_key(self, obj: RawEvent) -> str | None:
        return obj.dedup_key

    def get_headers(self, obj: RawEvent) -> dict | None:
        try:
            return raw_event_headers(obj)
        except BodyUndecryptable:
            return None  # the body says why

    def get_body(self, obj: RawEvent) -> dict:
        try:
            return body_for_api(raw_event_body(obj))
        except BodyUndecryptable as exc:
            return {"encoding": None, "data": None, "error": str(exc)}


class ViewerErrorField(serializers.CharField):
    """A handler's error text, payload-free unless the serializer's `may_read_payload`."""

    def to_representation(self, value):
        allowed = self.context.get("may_read_payload", False)
        return error_for_viewer(str(value), may_read_payload=allowed)


class DeliveryAttemptOutputSerializer(serializers.ModelSerializer):
    error = ViewerErrorField()

    class Meta:
        model = DeliveryAttempt
        fields = ("number", "started_at", "finished_at", "outcome", "error")


class DeliveryOutputSerializer(serializers.ModelSerializer):
    history = DeliveryAttemptOutputSerializer(many=True)
    last_error = ViewerErrorField()

    class Meta:
        model = Delivery
        fields = (
            "id",
            "handler",
            "status",
            "attempts",
            "next_attempt_at",
            "claimed_at",
            "last_error",
            "created_at",
            "finished_at",
            "history",
        )


class RawEventWithDeliveriesSerializer(RawEventWithPayloadOutputSerializer):
    """The detail answer, as the schema shows it (headers and body only with the payload
    permission)."""

    deliveries = DeliveryOutputSerializer(many=True)

    class Meta(RawEventWithPayloadOutputSerializer.Meta):
        fields = (*RawEventWithPayloadOutputSerializer.Meta.fields, "deliveries")


def _raw_event_serializer(request: Request) -> type[RawEventOutputSerializer]:
    if may_read_payload(request.user):
        return RawEventWithPayloadOutputSerializer
    return RawEventOutputSerializer


def _audit(request: Request, kind: str, **what) -> None:
    payload_access_record(
        actor=acting_user(request.user), kind=kind, via=OperatorActionVia.API, **what
    )


def _operator_action_response(record: OperatorAction) -> Response:
    return Response(OperatorActionOutputSerializer(record).data)


def operator_action_answer(record: OperatorAction) -> Response:
    """A one-object change (a pause, an incident's acknowledgement): the recorded operator
    action, or, refused, a 409 problem saying why, with the action that recorded it."""
    data = OperatorActionOutputSerializer(record).data
    if record.succeeded:
        return Response(data)
    return problem(409, record.results[0]["detail"], code="refused", operator_action=data)


class RawEventListApi(ConsoleApi):
    required_permission = "ingress.view_rawevent"
    # Read by the schema (drf-spectacular) for the list's parameters and envelope.
    pagination_class = UncountedLimitOffsetPagination

    class FilterSerializer(serializers.Serializer):
        # A field named like Field.source, which the stubs see as overridden: DRF's metaclass
        # takes declared fields off the class, so the attribute is never shadowed.
        source = serializers.CharField(required=False, max_length=64)  # type: ignore[assignment]
        provider = serializers.CharField(required=False, max_length=32)
        status = serializers.ChoiceField(choices=SignatureStatus.choices, required=False)
        reason = serializers.ChoiceField(choices=RejectionReason.choices, required=False)
        dispatch_status = serializers.ChoiceField(choices=DispatchStatus.choices, required=False)
        event_type = serializers.CharField(required=False, max_length=255)
        delivery_id = serializers.CharField(required=False, max_length=255)
        dedup_key = serializers.CharField(required=False, max_length=300)
        received_after = serializers.DateTimeField(required=False)
        received_before = serializers.DateTimeField(required=False)
        q = serializers.CharField(required=False, max_length=500)
        body_contains = serializers.CharField(required=False, max_length=500)
        include_payload = serializers.BooleanField(required=False, default=False)

        def validate(self, attrs):
            # A misspelt filter must not quietly return every event.
            unknown = sorted(set(self.initial_data) - set(self.fields) - PAGINATION_PARAMS)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown filter."] for name in unknown})
            after, before = attrs.get("received_after"), attrs.get("received_before")
            if after and before and after >= before:
                raise serializers.ValidationError(
                    {"received_before": ["Must be later than received_after."]}
                )
            return attrs

    @extend_schema(
        parameters=[FilterSerializer],
        responses=RawEventWithPayloadOutputSerializer(many=True),
        description="Body and headers only with include_payload (ingress.view_raw_payload).",
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        params = dict(filters.validated_data)
        may_read = may_read_payload(request.user)
        if params.get("body_contains") and not may_read:
            raise PermissionDenied(BODY_SEARCH_FORBIDDEN)
        if is_content_hash_key(params.get("dedup_key", "")) and not may_read:
            raise PermissionDenied(CONTENT_HASH_FORBIDDEN)
        if params.get("body_contains") and bodies_may_be_encrypted():
            raise serializers.ValidationError({"body_contains": [BODY_SEARCH_ENCRYPTED]})
        include_payload = params.pop("include_payload")
        if include_payload and not may_read:
            raise PermissionDenied(PAYLOAD_FORBIDDEN)
        query = params.pop("q", "")
        params["signature_status"] = params.pop("status", "")
        params["rejection_reason"] = params.pop("reason", "")
        queryset = raw_event_list(**params, include_payload=include_payload)
        if query:
            queryset = raw_event_search(queryset=queryset, query=query, may_read_payload=may_read)
        # Each payload search is audited with its term: a content-hash key is a body's hash.
        searched = [params.get("body_contains", "")]
        if may_read:
            dedup_key = params.get("dedup_key", "")
            searched += [dedup_key if is_content_hash_key(dedup_key) else ""]
            if any(is_content_hash_key(term) for term in search_terms(query)):
                searched.append(query)
        for term in searched:
            if term:
                _audit(request, PayloadAccessKind.SEARCH, search_term=term)

        paginator = UncountedLimitOffsetPagination()
        page = paginator.paginate_queryset(queryset, request, view=self)
        if include_payload:
            _audit(request, PayloadAccessKind.LIST, raw_event_ids=[event.pk for event in page])
        serializer_class = (
            RawEventWithPayloadOutputSerializer if include_payload else RawEventOutputSerializer
        )
        return paginator.get_paginated_response(serializer_class(page, many=True).data)


class RawEventDetailApi(ConsoleApi):
    required_permission = "ingress.view_rawevent"

    @extend_schema(responses=RawEventWithDeliveriesSerializer)
    def get(self, request: Request, raw_event_id: int) -> Response:
        queryset = RawEvent.objects.all()
        if not may_read_payload(request.user):
            queryset = queryset.defer(*PAYLOAD_FIELDS)
        event = get_object_or_404(queryset, pk=raw_event_id)
        if may_read_payload(request.user):
            _audit(request, PayloadAccessKind.VIEW, raw_event_ids=[event.pk])
        data = _raw_event_serializer(request)(event).data
        data["deliveries"] = DeliveryOutputSerializer(
            raw_event_deliveries(raw_event_id=event.pk),
            many=True,
            context={"may_read_payload": may_read_payload(request.user)},
        ).data
        return Response(data)


class OperatorActionApi(ConsoleApi):
    """POST {"ids": [...], ...}: one operator action, run and recorded by its service (the
    admin's confirmation page runs the same one from console.services.OPERATOR_ACTIONS)."""

    required_permission = "console.operate"
    input_serializer: type[serializers.Serializer] = IdsInputSerializer
    action: str  # OperatorActionKind

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return self.input_serializer  # the request body, as the schema shows it

    @extend_schema(responses=OperatorActionOutputSerializer)
    def post(self, request: Request) -> Response:
        serializer = self.input_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            record = OPERATOR_ACTIONS[self.action](
                actor=acting_user(request.user),
                ids=data["ids"],
                via=OperatorActionVia.API,
                # The operator's note: mark dead's required reason.
                note=data.get("reason", ""),
            )
        except OperatorActionError as exc:
            # Unknown ids, too many, none: nothing was done and nothing recorded.
            raise serializers.ValidationError({"ids": [str(exc)]}) from exc
        return _operator_action_response(record)


class RawEventReplayApi(OperatorActionApi):
    action = OperatorActionKind.RAW_EVENT_REPLAY


class RawEventReverifyApi(OperatorActionApi):
    action = OperatorActionKind.RAW_EVENT_REVERIFY


class SideEffectRearmApi(OperatorActionApi):
    action = OperatorActionKind.SIDE_EFFECT_REARM


class SideEffectMarkDeadApi(OperatorActionApi):
    input_serializer = MarkDeadInputSerializer
    action = OperatorActionKind.SIDE_EFFECT_MARK_DEAD


class RecapRetryRenderApi(OperatorActionApi):
    input_serializer = RecapIdsInputSerializer
    action = OperatorActionKind.RECAP_RETRY_RENDER


class QueueDepthsApi(ConsoleApi):
    required_permission = "console.view_ops"

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        depths = queue_depths()
        drains = queue_drains(now=timezone.now(), inbox=depths["ingress"], outbox=depths["outbox"])
        # How long until we catch up: backlog, drained over the window, time to clear it.
        depths["drain"] = {
            drain.queue: {
                "backlog": drain.backlog,
                "drained": drain.drained,
                "window_seconds": drain.window_seconds,
                "per_second": drain.per_second,
                "seconds_to_clear": drain.seconds_to_clear,
            }
            for drain in drains
        }
        return Response(depths)
