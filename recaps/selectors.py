"""Reads about recaps (QuerySets or plain values; no writes)."""

from collections.abc import Iterable
from datetime import datetime

from django.contrib.auth.models import User
from django.db.models import QuerySet

from recaps.errors import RecapNotFound
from recaps.models import Event, Photo, RecapId, RecapStatus, RecapVideo


def recap_get(*, recap_id: RecapId) -> RecapVideo:
    try:
        return RecapVideo.objects.select_related("event").get(pk=recap_id)
    except (RecapVideo.DoesNotExist, ValueError) as exc:  # ValueError: not a UUID
        raise RecapNotFound() from exc


def recap_list_for_buyer(*, buyer: User) -> QuerySet[RecapVideo]:
    return RecapVideo.objects.filter(buyer=buyer).order_by("-created_at")


def recaps_by_id(*, recap_ids: Iterable[object]) -> dict[object, RecapVideo]:
    """Recaps (with their events) by id, in one query; ids not found are absent."""
    return RecapVideo.objects.select_related("event").in_bulk(list(recap_ids))


def photo_keys_by_event(*, event_ids: Iterable[int]) -> dict[int, list[str]]:
    """The photos the render service cuts, per event, in the order they were taken (one
    query for a dispatcher's whole claimed batch)."""
    keys: dict[int, list[str]] = {}
    rows = (
        Photo.objects.filter(event_id__in=list(event_ids))
        .order_by("event_id", "taken_at", "id")
        .values_list("event_id", "storage_key")
    )
    for event_id, storage_key in rows:
        keys.setdefault(event_id, []).append(storage_key)
    return keys


def event_photo_keys(*, event: Event) -> list[str]:
    """The photos the render service cuts, in the order they were taken."""
    return photo_keys_by_event(event_ids=[event.pk]).get(event.pk, [])


def recaps_paid_without_side_effect(*, effect_type: str) -> QuerySet[RecapVideo]:
    return RecapVideo.objects.filter(status=RecapStatus.PAID).exclude(
        side_effects__effect_type=effect_type
    )


def recaps_stuck_rendering(*, older_than: datetime) -> QuerySet[RecapVideo]:
    return RecapVideo.objects.filter(status=RecapStatus.RENDERING, rendering_at__lt=older_than)
