"""Reads of raw events: the one FilterSet (the API list, a replay job's selection, the job
form), the searches, an event's deliveries. Each filter and search is served by an index, so a
page costs the page at any size of the store (docs/console.md, "What a page costs")."""

import json
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.core.exceptions import PermissionDenied
from django.db.backends.base.base import BaseDatabaseWrapper
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
from django.db.models.sql.compiler import SQLCompiler
from django.utils import timezone
from django.utils.text import smart_split, unescape_string_literal
from django_filters import rest_framework as filters
from rest_framework.exceptions import ValidationError

from console.api import ConsoleFilterSet, choice, reads_payload
from console.models import PayloadAccessKind
from ingress.encryption import bodies_may_be_encrypted
from ingress.models import (
    Delivery,
    DeliveryAttempt,
    DeliveryStatus,
    DispatchStatus,
    RawEvent,
    RawEventOrigin,
    RejectionReason,
    SignatureStatus,
)
from ingress.providers import is_content_hash_key
from ingress.sources import all_sources
from kernel.errors import EventDropError

# A body search reads every body received in its window: at most this long a window.
BODY_SEARCH_WINDOW = timedelta(hours=1)
BODY_SEARCH_FORBIDDEN = "Searching body text needs the permission ingress.view_raw_payload."
BODY_SEARCHED = (
    "Body text searched in the events received {start} (an hour at most per search: "
    "choose another hour with the received filter, received_at__gte)."
)
BODY_SEARCH_TOO_LONG = "A body search reads at most an hour of events: narrow the window."
BODY_SEARCH_ENCRYPTED = (
    "Body text cannot be searched: bodies are encrypted at rest (RAW_EVENT_ENCRYPTION_KEYS), "
    "and the database only sees ciphertext. Search by event id, delivery id or dedup key."
)
CONTENT_HASH_FORBIDDEN = (
    "A dedup key made from a body's hash is looked up only with the permission "
    "ingress.view_raw_payload."
)


class BodySearchUnavailable(EventDropError):
    pass


class BodyContains(Func):
    """True when `needle` occurs in `body`, compared as bytes: `convert_from(body, 'UTF8')`
    would raise on the first stored body that is not UTF-8. Case-sensitive, no index: bounded
    by a received window (partitions outside it are pruned)."""

    output_field = BooleanField()

    def __init__(self, needle: bytes):
        super().__init__(F("body"), Value(needle, output_field=BinaryField()))

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: object
    ) -> tuple[str, tuple]:
        body, needle = self.get_source_expressions()
        body_sql, body_params = compiler.compile(body)
        needle_sql, needle_params = compiler.compile(needle)
        return f"position({needle_sql} in {body_sql}) > 0", (*needle_params, *body_params)


def _body_contains(term: str) -> Q:
    """The term's UTF-8 bytes, or the \\u-escaped form many JSON encoders write instead."""
    if bodies_may_be_encrypted():
        raise BodySearchUnavailable(BODY_SEARCH_ENCRYPTED)
    condition = Q()
    for form in sorted({term.encode("utf-8"), json.dumps(term)[1:-1].encode("ascii")}):
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


class RawEventFilter(ConsoleFilterSet):
    """Raw events: the API list's filters, and a replay job's (source, event_type, status,
    reason, received window, handler, delivery_status)."""

    source = filters.CharFilter(max_length=64)
    provider = filters.CharFilter(max_length=32, method="by_provider")
    status = choice(SignatureStatus.choices, field_name="signature_status")
    reason = choice(RejectionReason.choices, method="by_reason")
    dispatch_status = choice(DispatchStatus.choices, method="by_dispatch")
    origin = choice(RawEventOrigin.choices)
    event_type = filters.CharFilter(max_length=255)
    delivery_id = filters.CharFilter(max_length=255)
    dedup_key = filters.CharFilter(max_length=300, method="by_dedup_key")
    received_after = filters.IsoDateTimeFilter(field_name="received_at", lookup_expr="gte")
    received_before = filters.IsoDateTimeFilter(field_name="received_at", lookup_expr="lt")
    q = filters.CharFilter(
        max_length=500, method="search", help_text="event id, delivery id or dedup key (exact)"
    )
    body_contains = filters.CharFilter(
        max_length=500,
        method="by_body",
        help_text="body text (ingress.view_raw_payload): at most an hour of received events",
    )
    include_payload = filters.BooleanFilter(
        method="unfiltered", help_text="bodies and headers too (ingress.view_raw_payload)"
    )
    handler = filters.CharFilter(max_length=255, method="with_delivery")
    delivery_status = choice(DeliveryStatus.choices, method="with_delivery")

    def _may_read(self) -> bool:
        return self.request is not None and reads_payload(self.request)

    def _audit(self, term: str) -> None:
        from console.api import record_payload_access

        if self.request is not None:
            record_payload_access(self.request, PayloadAccessKind.SEARCH, search_term=term)

    def by_provider(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        return rows.filter(source__in=sources_of(value))

    def by_reason(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        return rows.filter(rejected_for(value))

    def by_dispatch(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        return rows.filter(dispatched_as(value))

    def by_dedup_key(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        if is_content_hash_key(value):
            # A content-hash key is a body's hash: a lookup for payload readers, recorded.
            if not self._may_read():
                raise PermissionDenied(CONTENT_HASH_FORBIDDEN)
            self._audit(value)
        return rows.filter(dedup_key=value)

    def search(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        may_read = self._may_read()
        if may_read and any(is_content_hash_key(term) for term in search_terms(value)):
            self._audit(value)
        return raw_event_search(queryset=rows, query=value, may_read_payload=may_read)

    def by_body(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        if self.request is not None and not self._may_read():
            raise PermissionDenied(BODY_SEARCH_FORBIDDEN)
        if bodies_may_be_encrypted():
            raise ValidationError({"body_contains": [BODY_SEARCH_ENCRYPTED]})
        data = self.form.cleaned_data
        start, end = body_search_window(
            after=data.get("received_after"), before=data.get("received_before")
        )
        if data.get("received_before") and data["received_before"] > end:
            raise ValidationError({"received_before": [BODY_SEARCH_TOO_LONG]})
        self._audit(value)
        return raw_event_body_search(queryset=rows, term=value, start=start, end=end)

    def unfiltered(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        return rows

    def with_delivery(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        # Both delivery filters at once, whichever of them comes first.
        data = self.form.cleaned_data
        deliveries = Delivery.objects.filter(raw_event_id=OuterRef("id"))
        if data.get("handler"):
            deliveries = deliveries.filter(handler=data["handler"])
        if data.get("delivery_status"):
            deliveries = deliveries.filter(status=data["delivery_status"])
        if name == "delivery_status" and data.get("handler"):
            return rows  # done by the handler filter
        return rows.filter(Exists(deliveries))


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
