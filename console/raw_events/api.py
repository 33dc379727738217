"""Raw events in the console API: the list (filters: console.raw_events.selectors
RawEventFilter), one event with its deliveries, replay and re-verify. Bodies and headers only
for payload readers, each showing recorded (console.api, the payload policy)."""

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import (
    PAYLOAD_NEEDED,
    DetailApi,
    IdsInputSerializer,
    ListApi,
    OperatorActionApi,
    ViewerErrorField,
    reads_payload,
    record_payload_access,
)
from console.models import OperatorActionKind, PayloadAccessKind
from console.presentation import PAYLOAD_FIELDS, body_for_api, seconds_between
from console.raw_events.selectors import RawEventFilter, raw_event_deliveries
from ingress.encryption import BodyUndecryptable
from ingress.models import (
    Delivery,
    DeliveryAttempt,
    RawEvent,
    SignatureQuestion,
    SignatureStatus,
)
from ingress.payloads import raw_event_body, raw_event_headers
from ingress.providers import is_content_hash_key

PAYLOAD_REVEALING_FIELDS = ("body_sha256", "headers", "body", "dedup_key", "last_error", "error")


class RawEventSerializer(serializers.ModelSerializer):
    # The row keeps one verdict time; a rejection's is returned as rejected_at, never as
    # verified_at (a rejected event was never verified).
    rejected_at = serializers.DateTimeField(source="verified_at", allow_null=True, read_only=True)
    # A content-hash key confirms a guessed body, as body_sha256 does: both with the payload.
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


class RawEventWithPayloadSerializer(RawEventSerializer):
    headers = serializers.SerializerMethodField()
    body = serializers.SerializerMethodField()

    class Meta(RawEventSerializer.Meta):
        fields = (*RawEventSerializer.Meta.fields, "body_sha256", "headers", "body")

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


class DeliveryAttemptSerializer(serializers.ModelSerializer):
    error = ViewerErrorField()

    class Meta:
        model = DeliveryAttempt
        fields = ("number", "started_at", "finished_at", "outcome", "error")


class EventDeliverySerializer(serializers.ModelSerializer):
    history = DeliveryAttemptSerializer(many=True)
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


class SignatureQuestionSerializer(serializers.ModelSerializer):
    class Meta:
        model = SignatureQuestion
        fields = (
            "repeats",
            "asked_at",
            "answer",
            "answered_at",
            "answered_by",
            "evidence",
            "checked_at",
        )


class RawEventDetailSerializer(RawEventWithPayloadSerializer):
    """The detail answer, as the schema shows it (headers, body and hash with the payload
    permission only)."""

    deliveries = EventDeliverySerializer(many=True)
    # A questioned event's (ingress/signature_replays.py), and its answer once given; else null.
    signature_question = SignatureQuestionSerializer(allow_null=True)

    class Meta(RawEventWithPayloadSerializer.Meta):
        fields = (*RawEventWithPayloadSerializer.Meta.fields, "deliveries", "signature_question")


class RawEventListApi(ListApi):
    """Raw events, newest first, filtered as the admin's list (ids and keys exactly, body
    text explicitly and an hour at a time, bodies with include_payload)."""

    required_permission = "ingress.view_rawevent"
    filterset_class = RawEventFilter
    ordering = ("-received_at", "-id")

    def count_is_cheap(self, request: Request) -> bool:
        return False  # every matching row of months of webhooks costs more than the page

    def include_payload(self) -> bool:
        return self.request.query_params.get("include_payload", "").lower() in ("true", "1")

    def get_queryset(self) -> QuerySet[RawEvent]:
        if self.include_payload():
            return RawEvent.objects.all()
        return RawEvent.objects.defer(*PAYLOAD_FIELDS)

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return RawEventWithPayloadSerializer if self.include_payload() else RawEventSerializer

    @extend_schema(responses=RawEventWithPayloadSerializer(many=True))
    def get(self, request: Request, *args: object, **kwargs: object) -> Response:
        if self.include_payload() and not reads_payload(request):
            raise PermissionDenied(PAYLOAD_NEEDED)
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        assert page is not None
        if self.include_payload():
            record_payload_access(
                request, PayloadAccessKind.LIST, raw_event_ids=[event.pk for event in page]
            )
        return self.get_paginated_response(self.get_serializer(page, many=True).data)


class RawEventDetailApi(DetailApi):
    """One raw event with its deliveries and every attempt."""

    required_permission = "ingress.view_rawevent"

    def get_queryset(self) -> QuerySet[RawEvent]:
        if reads_payload(self.request):
            return RawEvent.objects.all()
        return RawEvent.objects.defer(*PAYLOAD_FIELDS)

    @extend_schema(responses=RawEventDetailSerializer)
    def get(self, request: Request, *args: object, **kwargs: object) -> Response:
        event = self.get_object()
        reader = reads_payload(request)
        if reader:
            record_payload_access(request, PayloadAccessKind.VIEW, raw_event_ids=[event.pk])
        serializer = RawEventWithPayloadSerializer if reader else RawEventSerializer
        data = serializer(event).data
        data["deliveries"] = EventDeliverySerializer(
            raw_event_deliveries(raw_event_id=event.pk), many=True, context={"request": request}
        ).data
        question = SignatureQuestion.objects.filter(raw_event_id=event.pk).first()
        data["signature_question"] = (
            SignatureQuestionSerializer(question).data if question else None
        )
        return Response(data)


class RawEventReplayApi(OperatorActionApi):
    """Replay verified raw events to every handler registered for them now (POST ids)."""

    action = OperatorActionKind.RAW_EVENT_REPLAY


class RawEventReverifyApi(OperatorActionApi):
    """Verify rejected raw events again, with the secrets configured now (POST ids)."""

    action = OperatorActionKind.RAW_EVENT_REVERIFY


class AnswerRepeatInputSerializer(IdsInputSerializer):
    # What shows that the provider sent the delivery, or never did: the answer's evidence.
    reason = serializers.CharField(max_length=1000, trim_whitespace=True)


class RawEventAcceptRepeatApi(OperatorActionApi):
    """Questioned events answered genuine: handled as any event (the reason is recorded)."""

    serializer_class = AnswerRepeatInputSerializer
    action = OperatorActionKind.RAW_EVENT_ACCEPT_REPEAT


class RawEventRejectRepeatApi(OperatorActionApi):
    """Questioned events answered replays: rejected `replayed_signature`, never handled."""

    serializer_class = AnswerRepeatInputSerializer
    action = OperatorActionKind.RAW_EVENT_REJECT_REPEAT
