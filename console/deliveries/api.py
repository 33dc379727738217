"""Deliveries in the console API: the list (console.deliveries.selectors DeliveryFilter) and
one delivery with every attempt."""

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api import (
    DetailApi,
    ListApi,
    OperatorActionApi,
    ViewerErrorField,
    reads_payload,
    record_payload_access,
)
from console.deliveries.selectors import DeliveryFilter
from console.models import OperatorActionKind, PayloadAccessKind
from console.raw_events.api import DeliveryAttemptSerializer
from ingress.models import Delivery, DeliveryStatus

# Statuses with a partial index of their own: counting them reads that index only.
COUNTED_STATUSES = {
    DeliveryStatus.PENDING,
    DeliveryStatus.PROCESSING,
    DeliveryStatus.DEAD,
    DeliveryStatus.HELD,
    DeliveryStatus.SUPERSEDED,
}


class DeliverySerializer(serializers.ModelSerializer):
    # A list shows the class only, to everyone (a list is not recorded; the page shows more).
    last_error = ViewerErrorField()
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

    def get_next_attempt_at(self, obj: Delivery) -> str | None:
        # Kept on done and dead rows from their last attempt: only a pending one has one.
        if obj.status != DeliveryStatus.PENDING:
            return None
        return serializers.DateTimeField().to_representation(obj.next_attempt_at)


class DeliveryDetailSerializer(DeliverySerializer):
    history = DeliveryAttemptSerializer(many=True)

    class Meta(DeliverySerializer.Meta):
        fields = (*DeliverySerializer.Meta.fields, "history")


class DeliveryListApi(ListApi):
    """Deliveries, newest first: status, handler, source, raw event, created window."""

    required_permission = "ingress.view_delivery"
    filterset_class = DeliveryFilter
    serializer_class = DeliverySerializer
    queryset = Delivery.objects.all()

    def count_is_cheap(self, request: Request) -> bool:
        return request.query_params.get("status") in COUNTED_STATUSES

    def get_serializer_context(self) -> dict:
        return {**super().get_serializer_context(), "payload": False}


class DeliveryDetailApi(DetailApi):
    """One delivery with every attempt (a handler's message for payload readers, recorded)."""

    required_permission = "ingress.view_delivery"
    serializer_class = DeliveryDetailSerializer

    def get_queryset(self) -> QuerySet[Delivery]:
        return Delivery.objects.prefetch_related("history")

    @extend_schema(responses=DeliveryDetailSerializer)
    def get(self, request: Request, *args: object, **kwargs: object) -> Response:
        delivery = self.get_object()
        errors = [delivery.last_error, *(attempt.error for attempt in delivery.history.all())]
        if reads_payload(request) and any(errors):
            record_payload_access(
                request, PayloadAccessKind.VIEW, raw_event_ids=[delivery.raw_event_id]
            )
        return Response(self.get_serializer(delivery).data)


class DeliveryRearmApi(OperatorActionApi):
    """Re-arm deliveries (POST ids): a dead one armed afresh, a processing one whose worker is
    gone taken back; one a live worker runs is refused."""

    action = OperatorActionKind.DELIVERY_REARM
