"""The audit trail in the console API: operator actions, newest first."""

from django_filters import rest_framework as filters

from console.api import ConsoleFilterSet, ListApi, OperatorActionOutputSerializer, choice
from console.models import (
    OperatorAction,
    OperatorActionKind,
    OperatorActionOutcome,
    OperatorActionVia,
)


class OperatorActionFilter(ConsoleFilterSet):
    action = choice(OperatorActionKind.choices)
    outcome = choice(OperatorActionOutcome.choices)
    via = choice(OperatorActionVia.choices)
    actor = filters.CharFilter(
        field_name="actor_username", max_length=150, help_text="username (exact)"
    )
    started_after = filters.IsoDateTimeFilter(field_name="started_at", lookup_expr="gte")
    started_before = filters.IsoDateTimeFilter(field_name="started_at", lookup_expr="lt")


class OperatorActionListApi(ListApi):
    """The audit trail: action, outcome, via, started window, username."""

    required_permission = "console.view_operatoraction"
    filterset_class = OperatorActionFilter
    serializer_class = OperatorActionOutputSerializer
    queryset = OperatorAction.objects.all()
    ordering = ("-started_at", "-id")
