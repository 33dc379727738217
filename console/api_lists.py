"""What every console list API shares: cursor pagination with `count` where cheap, query-string
filters that refuse a misspelt name, and the list view itself (console/apis_reads.py,
console/apis_jobs.py)."""

from django.db.models import QuerySet
from rest_framework import serializers
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from console.apis import MAX_PAGE_LIMIT, ConsoleApi
from console.presentation import may_read_payload

CURSOR_PARAMS = {"limit", "cursor"}
UNKNOWN_FILTER = "Unknown filter."
WINDOW_ORDER = "Must be later than {after}."


class ConsoleCursorPagination(CursorPagination):
    """A cursor over the view's `ordering`, `limit` rows a page (at most MAX_PAGE_LIMIT),
    with `count` when the view says counting its selection is cheap."""

    page_size_query_param = "limit"
    max_page_size = MAX_PAGE_LIMIT
    count: int | None = None

    def paginate_queryset(
        self, queryset: QuerySet, request: Request, view: APIView | None = None
    ) -> list | None:
        assert isinstance(view, ListApi)  # a list view pages its own rows
        self.ordering = view.ordering
        self.page_size = api_settings.PAGE_SIZE
        counted = view.count_is_cheap(request)
        self.count = queryset.count() if counted else None
        return super().paginate_queryset(queryset, request, view)

    def get_paginated_response(self, data: object) -> Response:
        body: dict[str, object] = {
            "next": self.get_next_link(),
            "previous": self.get_previous_link(),
            "results": data,
        }
        if self.count is not None:
            body = {"count": self.count, **body}
        return Response(body)

    def get_paginated_response_schema(self, schema: dict) -> dict:
        response = super().get_paginated_response_schema(schema)
        response["properties"]["count"] = {
            "type": "integer",
            "description": "Every row the filters select; absent where counting is not cheap.",
        }
        response["required"] = ["next", "previous", "results"]
        return response


class FiltersSerializer(serializers.Serializer):
    """Query-string filters: a misspelt one is a 400 naming it, never an unfiltered list;
    `<x>_after` must come before `<x>_before`."""

    windows: tuple[str, ...] = ()

    def validate(self, attrs: dict) -> dict:
        unknown = sorted(set(self.initial_data) - set(self.fields) - CURSOR_PARAMS)
        if unknown:
            raise serializers.ValidationError({name: [UNKNOWN_FILTER] for name in unknown})
        for window in self.windows:
            after, before = attrs.get(f"{window}_after"), attrs.get(f"{window}_before")
            if after and before and after >= before:
                raise serializers.ValidationError(
                    {f"{window}_before": [WINDOW_ORDER.format(after=f"{window}_after")]}
                )
        return attrs


class ListApi(ConsoleApi):
    """A filtered, cursor-paginated list: `filters` validate the query string, `rows()`
    selects, `serializer` writes each row."""

    ordering: str | tuple[str, ...] = "-id"
    filters: type[FiltersSerializer]
    serializer: type[serializers.Serializer]
    pagination_class = ConsoleCursorPagination

    def rows(self, filters: dict) -> QuerySet:
        raise NotImplementedError

    def count_is_cheap(self, request: Request) -> bool:
        return True

    def get(self, request: Request) -> Response:
        filters = self.filters(data=request.query_params)
        filters.is_valid(raise_exception=True)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(self.rows(filters.validated_data), request, view=self)
        context = {"may_read_payload": may_read_payload(request.user)}
        return paginator.get_paginated_response(
            self.serializer(page, many=True, context=context).data
        )


def in_window(rows: QuerySet, field: str, filters: dict, name: str) -> QuerySet:
    """`field` within the filters' `<name>_after` / `<name>_before`: [after, before)."""
    if filters.get(f"{name}_after"):
        rows = rows.filter(**{f"{field}__gte": filters[f"{name}_after"]})
    if filters.get(f"{name}_before"):
        rows = rows.filter(**{f"{field}__lt": filters[f"{name}_before"]})
    return rows
