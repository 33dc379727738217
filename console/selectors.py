"""Reads for the console and its API: raw event lists, search, deliveries, queue depths."""

from collections.abc import Iterable
from datetime import datetime

from django.db.models import (
    Count,
    Q,
    QuerySet,
)
from django.utils import timezone
from knox.models import AuthToken

from console.models import OperatorAction
from ingress.models import Delivery
from ingress.selectors import inbox_depths
from outbox.models import RecapSideEffect
from outbox.selectors import side_effect_depths
from recaps.models import RecapVideo


def _by_status(queryset: QuerySet, ids: Iterable[object]) -> list[tuple[str, int]]:
    rows = (
        queryset.filter(id__in=list(ids))
        .values("status")
        .annotate(count=Count("id"))
        .order_by("status")
    )
    return [(row["status"], row["count"]) for row in rows]


def side_effects_by_status(*, ids: Iterable[int]) -> list[tuple[str, int]]:
    """(status, how many) of a selection of side effects (for confirmation pages)."""
    return _by_status(RecapSideEffect.objects.all(), ids)


def deliveries_by_status(*, ids: Iterable[int]) -> list[tuple[str, int]]:
    """(status, how many) of a selection of deliveries (for confirmation pages)."""
    return _by_status(Delivery.objects.all(), ids)


def recaps_by_status(*, ids: Iterable[object]) -> list[tuple[str, int]]:
    """(status, how many) of a selection of recaps (for confirmation pages)."""
    return _by_status(RecapVideo.objects.all(), ids)


def operator_actions_on(*, target_model: str, object_id: int | str, limit: int = 10) -> list:
    """The latest operator actions that touched one object: "has someone replayed this?"."""
    actions = OperatorAction.objects.filter(target_model=target_model).order_by(
        "-started_at", "-id"
    )
    return list(actions.filter(target_ids__contains=[object_id])[:limit])


def inbox_queue_depths(*, now: datetime | None = None) -> dict:
    """The inbox's depths, the held deliveries among them (a delivery a pause holds is
    waiting too)."""
    return inbox_depths(now=now)


def queue_depths() -> dict:
    """Depths of every queue an operator can act on, by pipeline stage."""
    return {"ingress": inbox_queue_depths(), "outbox": side_effect_depths()}


def api_token_list(*, username: str = "") -> QuerySet[AuthToken]:
    """Tokens that have not expired, newest first (expired ones are deleted on next use)."""
    tokens = AuthToken.objects.select_related("user").filter(
        Q(expiry__isnull=True) | Q(expiry__gt=timezone.now())
    )
    if username:
        tokens = tokens.filter(user__username=username)
    return tokens.order_by("-created")
