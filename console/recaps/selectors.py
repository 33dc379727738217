"""Reads of recaps for the console: the FilterSet of the API list, the render status."""

import uuid

from django.db.models import OuterRef, Q, QuerySet, Subquery
from django_filters import rest_framework as filters

from console.api import ConsoleFilterSet, choice
from outbox.models import EffectType, RecapSideEffect
from recaps.models import RecapStatus, RecapVideo


def recaps_with_render_status() -> QuerySet[RecapVideo]:
    """Recaps with their render side effect's status, in the same query (as the admin)."""
    render_status = RecapSideEffect.objects.filter(
        recap=OuterRef("pk"), effect_type=EffectType.RENDER
    ).values("status")[:1]
    return RecapVideo.objects.select_related("buyer").annotate(
        render_status=Subquery(render_status)
    )


def recap_search(rows: QuerySet, term: str) -> QuerySet:
    """The recap id, payment reference, checkout session id or render id, exactly (indexed)."""
    term = term.strip()
    if not term:
        return rows
    try:
        return rows.filter(id=uuid.UUID(term))
    except ValueError:
        return rows.filter(
            Q(payment_reference=term) | Q(checkout_session_id=term) | Q(render_id=term)
        )


class RecapFilter(ConsoleFilterSet):
    status = choice(RecapStatus.choices)
    is_free = filters.BooleanFilter()
    paid_after = filters.IsoDateTimeFilter(field_name="paid_at", lookup_expr="gte")
    paid_before = filters.IsoDateTimeFilter(field_name="paid_at", lookup_expr="lt")
    updated_after = filters.IsoDateTimeFilter(field_name="updated_at", lookup_expr="gte")
    updated_before = filters.IsoDateTimeFilter(field_name="updated_at", lookup_expr="lt")
    q = filters.CharFilter(
        max_length=255,
        method="search",
        help_text="recap id, payment reference, checkout session id or render id (exact)",
    )

    def search(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        return recap_search(rows, value)
