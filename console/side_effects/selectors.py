"""Reads of recap side effects: the one FilterSet (the API list, a re-arm job's selection,
the job form)."""

from datetime import timedelta

from django.core.validators import RegexValidator
from django.db.models import QuerySet
from django.utils import timezone
from django_filters import rest_framework as filters

from console.api import ConsoleFilterSet, choice
from outbox.models import EffectType, SideEffectStatus

# The admin's "in this state for" filter (console/side_effects/admin.py AgeFilter).
STATE_AGES = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "1d": timedelta(days=1)}


class SideEffectFilter(ConsoleFilterSet):
    """Side effects: status, error class (`reason` in a job), attempts (`n` or `n+`), how long
    in their state, effect type, recap, created window (`received_*` in a job)."""

    status = choice(SideEffectStatus.choices)
    last_error_class = filters.CharFilter(max_length=64)
    reason = filters.CharFilter(max_length=64, field_name="last_error_class")
    attempts = filters.CharFilter(
        method="by_attempts",
        validators=[RegexValidator(r"^\d{1,4}\+?$")],
        help_text="n, or n+ for n or more",
    )
    state_age = choice(sorted((age, age) for age in STATE_AGES), method="by_state_age")
    effect_type = choice(EffectType.choices)
    recap = filters.UUIDFilter(field_name="recap_id")
    created_after = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    received_after = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    received_before = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    def by_attempts(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        if value.endswith("+"):
            return rows.filter(attempts__gte=int(value[:-1]))
        return rows.filter(attempts=int(value))

    def by_state_age(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        return rows.filter(updated_at__lt=timezone.now() - STATE_AGES[value])
