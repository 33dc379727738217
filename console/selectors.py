"""Reads for the console and its API: raw event lists, search, deliveries, queue depths."""

import json
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db.models import (
    BinaryField,
    BooleanField,
    Count,
    Exists,
    F,
    Func,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Value,
)
from django.utils import timezone
from django.utils.text import smart_split, unescape_string_literal
from knox.models import AuthToken

from console.models import OperatorAction
from ingress.encryption import bodies_may_be_encrypted
from ingress.handlers import all_handlers
from ingress.models import (
    Delivery,
    DeliveryAttempt,
    DispatchStatus,
    RawEvent,
    SignatureStatus,
)
from ingress.providers import is_content_hash_key
from ingress.selectors import inbox_depths
from ingress.sources import all_sources
from kernel.errors import EventDropError
from outbox.models import RecapSideEffect
from outbox.selectors import side_effect_depths
from recaps.models import RecapVideo

# Columns a list never needs: a page of 100 rows must not drag 100 MiB of bodies along.
PAYLOAD_FIELDS = ("body", "headers")


class BodyContains(Func):
    """True when `needle` occurs in `body`, compared as bytes.

    The comparison is on bytes, never on decoded text: `convert_from(body, 'UTF8')` would raise
    on the first stored body that is not valid UTF-8 and take the whole search down with it.
    Byte search is case-sensitive and cannot use an index; on a large store combine it with a
    date filter, so partitions outside the range are pruned before any body is read.
    """

    output_field = BooleanField()

    def __init__(self, needle: bytes):
        super().__init__(F("body"), Value(needle, output_field=BinaryField()))

    def as_postgresql(self, compiler, connection, **extra_context):
        body, needle = self.get_source_expressions()
        body_sql, body_params = compiler.compile(body)
        needle_sql, needle_params = compiler.compile(needle)
        return f"position({needle_sql} in {body_sql}) > 0", (*needle_params, *body_params)


BODY_SEARCH_ENCRYPTED = (
    "Body text cannot be searched: bodies are encrypted at rest (RAW_EVENT_ENCRYPTION_KEYS), "
    "and the database only sees ciphertext. Search by event id, delivery id or dedup key."
)


class BodySearchUnavailable(EventDropError):
    pass


def _body_contains(term: str) -> Q:
    """The term's UTF-8 bytes, or the \\u-escaped form many JSON encoders write instead.

    Refused while bodies may be encrypted: a search of ciphertext would find nothing,
    silently (BodySearchUnavailable; callers show BODY_SEARCH_ENCRYPTED).
    """
    if bodies_may_be_encrypted():
        raise BodySearchUnavailable(BODY_SEARCH_ENCRYPTED)
    forms = sorted({term.encode("utf-8"), json.dumps(term)[1:-1].encode("ascii")})
    condition = Q()
    for form in forms:
        condition |= Q(BodyContains(form))
    return condition


def search_terms(query: str) -> list[str]:
    """Whitespace-separated terms; quotes keep a phrase together (as in Django's admin)."""
    terms = []
    for bit in smart_split(query):
        if bit.startswith(('"', "'")) and bit[0] == bit[-1] and len(bit) > 1:
            bit = unescape_string_literal(bit)
        if bit:
            terms.append(bit)
    return terms


def raw_event_search(
    *, queryset: QuerySet[RawEvent], query: str, may_read_payload: bool
) -> QuerySet[RawEvent]:
    """Every term must match the event id, delivery id or dedup key, exactly: each an index
    lookup, for everyone. A content-hash dedup key is matched only for payload readers (a
    search is an oracle for what a body contains). Body text is raw_event_body_search's."""
    for term in search_terms(query):
        condition = Q(delivery_id=term)
        if may_read_payload or not is_content_hash_key(term):
            condition |= Q(dedup_key=term)
        identifier = term.removeprefix("#")
        if identifier.isdigit() and len(identifier) < 19:
            condition |= Q(id=int(identifier))
        queryset = queryset.filter(condition)
    return queryset


# A body search reads every body received in its window: at most this long a window.
BODY_SEARCH_WINDOW = timedelta(hours=1)
BODY_SEARCH_FORBIDDEN = "Searching body text needs the permission ingress.view_raw_payload."
BODY_SEARCHED = (
    "Body text searched in the events received {start} (an hour at most per search: "
    "choose another hour with the received filter, received_at__gte)."
)
BODY_SEARCH_TOO_LONG = "A body search covers at most an hour: narrow the received window."


def body_search_window(
    *, after: datetime | None, before: datetime | None, now: datetime | None = None
) -> tuple[datetime, datetime]:
    """The received window a body search reads: the one asked for, cut to BODY_SEARCH_WINDOW
    from its start; the last hour when none is asked for."""
    now = now or timezone.now()
    if after is None:
        end = min(before or now, now)
        return end - BODY_SEARCH_WINDOW, end
    return after, min(before or after + BODY_SEARCH_WINDOW, after + BODY_SEARCH_WINDOW)


def format_time_window(start: datetime, end: datetime) -> str:
    fmt = "%Y-%m-%d %H:%M:%S"
    return f"from {timezone.localtime(start):{fmt}} to {timezone.localtime(end):{fmt} %Z}"


def raw_event_body_search(
    *, queryset: QuerySet[RawEvent], term: str, start: datetime, end: datetime
) -> QuerySet[RawEvent]:
    """Events received in [start, end) whose body holds every term of `term` (bytes)."""
    queryset = queryset.filter(received_at__gte=start, received_at__lt=end)
    for part in search_terms(term):
        queryset = queryset.filter(_body_contains(part))
    return queryset


# --- filters served by an index (the admin's and the API's) -------------------------------------


def sources_of(provider: str) -> list[str]:
    """The configured sources of a provider: its filter, on the (source, received_at) index."""
    return sorted(name for name, source in all_sources().items() if source.provider == provider)


def rejected_for(reason: str) -> Q:
    """Rejected for `reason`: on the rejected rows' partial index (the CHECK that ties a
    reason to `rejected` is no proof the planner takes)."""
    return Q(signature_status=SignatureStatus.REJECTED, rejection_reason=reason)


def dispatched_as(status: str) -> Q:
    """`waiting` is `pending` (the pending index), the others have their partial index."""
    if status == DispatchStatus.WAITING:
        return Q(dispatch_status=status, signature_status=SignatureStatus.PENDING)
    return Q(dispatch_status=status)


def deliveries_of_source(source: str) -> Q:
    """Deliveries of a source's events: to its provider's handlers (the handler index),
    each checked against its event."""
    configured = all_sources().get(source)
    events = Q(Exists(RawEvent.objects.filter(id=OuterRef("raw_event_id"), source=source)))
    if configured is None:
        return events
    handlers = [spec.name for spec in all_handlers() if spec.provider == configured.provider]
    return Q(handler__in=handlers) & events


def raw_event_list(
    *,
    source: str = "",
    provider: str = "",
    signature_status: str = "",
    rejection_reason: str = "",
    dispatch_status: str = "",
    event_type: str = "",
    delivery_id: str = "",
    dedup_key: str = "",
    received_after: datetime | None = None,
    received_before: datetime | None = None,
    body_contains: str = "",
    include_payload: bool = False,
) -> QuerySet[RawEvent]:
    """Raw events, newest first; empty filters are ignored."""
    queryset = RawEvent.objects.order_by("-received_at", "-id")
    if not include_payload:
        queryset = queryset.defer(*PAYLOAD_FIELDS)
    exact = {
        "source": source,
        "provider": provider,
        "signature_status": signature_status,
        "rejection_reason": rejection_reason,
        "dispatch_status": dispatch_status,
        "event_type": event_type,
        "delivery_id": delivery_id,
        "dedup_key": dedup_key,
    }
    queryset = queryset.filter(**{field: value for field, value in exact.items() if value})
    if received_after is not None:
        queryset = queryset.filter(received_at__gte=received_after)
    if received_before is not None:
        queryset = queryset.filter(received_at__lt=received_before)
    if body_contains:
        start, end = body_search_window(after=received_after, before=received_before)
        queryset = raw_event_body_search(
            queryset=queryset, term=body_contains, start=start, end=end
        )
    return queryset


def raw_event_deliveries(*, raw_event_id: int) -> list[Delivery]:
    """Every delivery of one event with its attempts, oldest first."""
    return list(
        Delivery.objects.filter(raw_event_id=raw_event_id)
        .order_by("created_at", "id")
        .prefetch_related(
            Prefetch("history", queryset=DeliveryAttempt.objects.order_by("started_at", "id"))
        )
    )


def raw_events_by_status(*, ids: Iterable[int]) -> list[dict]:
    """How a selection splits by verification and dispatch status (for confirmation pages)."""
    return list(
        RawEvent.objects.filter(id__in=list(ids))
        .values("signature_status", "dispatch_status")
        .annotate(count=Count("id"))
        .order_by("signature_status", "dispatch_status")
    )


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


def recaps_by_status(*, ids: Iterable[object]) -> list[tuple[str, int]]:
    """(status, how many) of a selection of recaps (for confirmation pages)."""
    return _by_status(RecapVideo.objects.all(), ids)


def operator_action_list() -> QuerySet[OperatorAction]:
    return OperatorAction.objects.order_by("-started_at", "-id")


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
