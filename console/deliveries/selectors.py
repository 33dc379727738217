"""Reads of deliveries: the one FilterSet (the API list, a re-arm job's selection, the job
form), each filter on an index."""

import re

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet
from django_filters import rest_framework as filters
from rest_framework.exceptions import ValidationError

from console.api import ConsoleFilterSet, IdFilter, choice
from ingress.handlers import all_handlers
from ingress.models import Delivery, DeliveryStatus, RawEvent
from ingress.sources import all_sources

# The class a stored handler error starts with (`Class: message`), as console/incidents/services.py
# groups them: the `reason` filter matches that prefix and never the message.
ERROR_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,200}")
NOT_AN_ERROR_CLASS = (
    "A delivery's reason is its error's class, e.g. KeyError (a handler's message may quote "
    "the payload, so it is not searched)."
)


# The handlers deliveries name, one index probe each on (handler, id): PostgreSQL has no
# skip scan, so it is written as one.
DELIVERY_HANDLERS = """
WITH RECURSIVE named(handler) AS (
    (SELECT handler FROM {table} ORDER BY handler LIMIT 1)
    UNION ALL
    SELECT (SELECT d.handler FROM {table} AS d WHERE d.handler > named.handler
            ORDER BY d.handler LIMIT 1)
    FROM named WHERE named.handler IS NOT NULL
) SELECT handler FROM named WHERE handler IS NOT NULL
"""


def delivery_handlers() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(DELIVERY_HANDLERS.format(table=Delivery._meta.db_table))
        return [handler for (handler,) in cursor.fetchall()]


def deliveries_of_source(source: str) -> Q:
    """Deliveries of a source's events, on the handler index: to its provider's handlers and
    to handlers no longer registered. Each is checked against its event (a probe per
    partition) unless the source is its provider's only one and no delivery names a handler
    no longer registered: then its provider's handlers are exactly its own."""
    configured = all_sources().get(source)
    events = Q(Exists(RawEvent.objects.filter(id=OuterRef("raw_event_id"), source=source)))
    if configured is None:
        return events
    registered = {spec.name: spec.provider for spec in all_handlers()}
    named = delivery_handlers()
    unknown = [name for name in named if name not in registered]
    handlers = [name for name in named if registered.get(name) == configured.provider]
    sole = [n for n, s in all_sources().items() if s.provider == configured.provider] == [source]
    if sole and not unknown:
        return Q(handler__in=handlers)
    return Q(handler__in=handlers + unknown) & events


def _of_events(**lookups: object) -> Q:
    return Q(Exists(RawEvent.objects.filter(id=OuterRef("raw_event_id"), **lookups)))


class DeliveryFilter(ConsoleFilterSet):
    """Deliveries: the API list's filters (status, handler, source, raw event, created window)
    and a re-arm job's (status, handler, source, event type, error class, received window)."""

    status = choice(DeliveryStatus.choices)
    handler = filters.CharFilter(max_length=255)
    source = filters.CharFilter(max_length=64, method="by_source")
    raw_event = IdFilter(field_name="raw_event_id")
    created_after = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    event_type = filters.CharFilter(max_length=255, method="by_event_type")
    reason = filters.CharFilter(
        max_length=255, method="by_reason", help_text="the class its last error starts with"
    )
    received_after = filters.IsoDateTimeFilter(method="by_received")
    received_before = filters.IsoDateTimeFilter(method="by_received")

    def by_source(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        return rows.filter(deliveries_of_source(value))

    def by_event_type(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        return rows.filter(_of_events(event_type=value))

    def by_reason(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        if not ERROR_CLASS.fullmatch(value):
            raise ValidationError({"reason": [NOT_AN_ERROR_CLASS]})
        return rows.filter(last_error__startswith=f"{value}:")

    def by_received(self, rows: QuerySet, name: str, value: str) -> QuerySet:
        lookup = "received_at__gte" if name == "received_after" else "received_at__lt"
        return rows.filter(_of_events(**{lookup: value}))
