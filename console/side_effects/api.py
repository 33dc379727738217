"""Recap side effects in the console API: the list, one row with its history, re-arm and
mark dead."""

from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.request import Request

from console.api import DetailApi, IdsInputSerializer, ListApi, OperatorActionApi
from console.models import OperatorActionKind
from console.side_effects.selectors import SideEffectFilter
from outbox.models import RecapSideEffect, RecapSideEffectAttempt, SideEffectStatus
from outbox.selectors import QUEUE_STATUSES as UNFINISHED


class SideEffectAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = RecapSideEffectAttempt
        fields = ("number", "outcome", "error_class", "error", "started_at", "finished_at")


class SideEffectSerializer(serializers.ModelSerializer):
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


class SideEffectDetailSerializer(SideEffectSerializer):
    history = SideEffectAttemptSerializer(many=True)

    class Meta(SideEffectSerializer.Meta):
        fields = (*SideEffectSerializer.Meta.fields, "history")


class SideEffectListApi(ListApi):
    """Recap side effects, newest first: status, error class, attempts, state age, effect
    type, created window, recap."""

    required_permission = "outbox.view_recapsideeffect"
    filterset_class = SideEffectFilter
    serializer_class = SideEffectSerializer
    queryset = RecapSideEffect.objects.all()

    def count_is_cheap(self, request: Request) -> bool:
        # Counted on an index that narrows it (a status of its own, an error class, a recap),
        # never over every side effect ever made.
        params = request.query_params
        return params.get("status") in UNFINISHED or bool(
            params.get("last_error_class") or params.get("recap")
        )


class SideEffectDetailApi(DetailApi):
    """One side effect with its history: every attempt, re-arm and give-up."""

    required_permission = "outbox.view_recapsideeffect"
    serializer_class = SideEffectDetailSerializer

    def get_queryset(self) -> QuerySet[RecapSideEffect]:
        return RecapSideEffect.objects.prefetch_related("history")


class SideEffectRearmApi(OperatorActionApi):
    """Re-arm side effects: due now, fresh attempts, the same idempotency key (POST ids)."""

    action = OperatorActionKind.SIDE_EFFECT_REARM


class MarkDeadInputSerializer(IdsInputSerializer):
    reason = serializers.CharField(max_length=1000, trim_whitespace=True)


class SideEffectMarkDeadApi(OperatorActionApi):
    """Give up on side effects; the reason is required and becomes the recap's (POST)."""

    serializer_class = MarkDeadInputSerializer
    action = OperatorActionKind.SIDE_EFFECT_MARK_DEAD
