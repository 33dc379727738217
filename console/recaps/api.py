"""Recaps in the console API: the list, one recap with its side effects, retry render."""

from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.request import Request

from console.api import DetailApi, ListApi, OperatorActionApi
from console.models import OperatorActionKind
from console.recaps.selectors import RecapFilter, recaps_with_render_status
from console.services import BULK_LIMIT
from console.side_effects.api import SideEffectSerializer
from recaps.models import RecapStatus, RecapVideo


class RecapSerializer(serializers.ModelSerializer):
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


class RecapDetailSerializer(RecapSerializer):
    side_effects = SideEffectSerializer(many=True)

    class Meta(RecapSerializer.Meta):
        fields = (
            *RecapSerializer.Meta.fields,
            "checkout_session_id",
            "render_id",
            "video_url",
            "rendering_at",
            "side_effects",
        )


class RecapListApi(ListApi):
    """Recaps, newest first: status, free or not, paid and updated windows, search."""

    required_permission = "recaps.view_recapvideo"
    filterset_class = RecapFilter
    serializer_class = RecapSerializer
    ordering = ("-created_at", "-id")

    def get_queryset(self) -> QuerySet[RecapVideo]:
        return recaps_with_render_status()

    def count_is_cheap(self, request: Request) -> bool:
        # A search, or a status other than the one most recaps end in: on an index.
        status = request.query_params.get("status")
        return bool(request.query_params.get("q")) or bool(status and status != RecapStatus.READY)


class RecapDetailApi(DetailApi):
    """One recap with its side effects."""

    required_permission = "recaps.view_recapvideo"
    serializer_class = RecapDetailSerializer

    def get_queryset(self) -> QuerySet[RecapVideo]:
        return recaps_with_render_status().prefetch_related("side_effects")


class RecapIdsInputSerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=serializers.UUIDField(), allow_empty=False, max_length=BULK_LIMIT
    )


class RecapRetryRenderApi(OperatorActionApi):
    """Render recaps (again) through the outbox (POST ids, recap UUIDs)."""

    serializer_class = RecapIdsInputSerializer
    action = OperatorActionKind.RECAP_RETRY_RENDER
