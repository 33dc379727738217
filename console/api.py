"""What every endpoint of the console API shares: who may call it, one cursor pagination, one
way to filter (a django-filter FilterSet per kind of row), the payload policy, the operator
action answer, the root and the schema.

Staff only (IsAdminUser) plus the admin's own permission, named per endpoint; no other site
can drive it: writes accept only JSON (a form post is a 415) and a write whose `Origin` or
`Sec-Fetch-Site` names another site is a 403 whatever its credentials
(console/authentication.py for the credentials). Every error is one problem shape
(kernel/problems.py); no request a client can send is a 500 (docs/console.md, "The API").
"""

import binascii
import re
from base64 import b64decode
from typing import Any
from urllib import parse

from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django.urls import get_resolver
from django_filters import rest_framework as filters
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.renderers import OpenApiJsonRenderer
from drf_spectacular.utils import extend_schema, inline_serializer
from drf_spectacular.views import SpectacularAPIView
from rest_framework import generics, serializers
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.permissions import SAFE_METHODS, AllowAny, BasePermission, IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from console.models import OperatorAction, OperatorActionVia
from console.presentation import error_for_viewer, may_read_payload
from console.services import (
    BULK_LIMIT,
    OPERATOR_ACTIONS,
    OperatorActionError,
    acting_user,
    payload_access_record,
)
from kernel.api_access import BoundedJSONParser, SameSiteWrites
from kernel.problems import PROBLEM_CONTENT_TYPE, problem

# PostgreSQL bigint: a larger id is bad input, not a database error.
MAX_ID = 2**63 - 1
MAX_PAGE_LIMIT = 1000
PAGE_PARAMS = frozenset({"limit", "cursor"})
UNKNOWN_FILTER = "Unknown filter."
BAD_LIMIT = "A whole number from 1 (at most {limit} rows are answered)."
INVALID_CURSOR = "Invalid cursor."
WINDOW_ORDER = "Must be later than {after}."
PAYLOAD_NEEDED = "This needs the permission ingress.view_raw_payload."


def has_perm(permission: str) -> type[BasePermission]:
    class HasPermission(BasePermission):
        message = f"This needs the permission {permission}."

        def has_permission(self, request: Request, view: APIView) -> bool:
            return not permission or request.user.has_perm(permission)

    return HasPermission


class ConsoleApi(APIView):
    """Every console endpoint: staff, same-site writes, the permission it names (`write_permission`
    for writes when it differs from the reads')."""

    required_permission = ""
    write_permission = ""
    parser_classes = [BoundedJSONParser]

    def get_permissions(self) -> list[BasePermission]:
        needed = self.required_permission
        if self.write_permission and self.request.method not in SAFE_METHODS:
            needed = self.write_permission
        return [IsAdminUser(), SameSiteWrites(), has_perm(needed)()]


# --- the payload policy ------------------------------------------------------------------------


class ReadsPayload(BasePermission):
    """Bodies, headers, a body's hash and a handler's message (which may quote a body) are for
    staff with ingress.view_raw_payload only, each showing recorded (console.PayloadAccess)."""

    message = PAYLOAD_NEEDED

    def has_permission(self, request: Request, view: APIView | None) -> bool:
        return may_read_payload(request.user)


def reads_payload(request: Request) -> bool:
    return ReadsPayload().has_permission(request, None)


def record_payload_access(request: Request, kind: str, **what: Any) -> None:
    payload_access_record(
        actor=acting_user(request.user), kind=kind, via=OperatorActionVia.API, **what
    )


class ViewerErrorField(serializers.CharField):
    """A handler's error text: the whole of it for payload readers, else its class and a fixed
    sentence (`payload=False` in the context: the class only, as every list shows it)."""

    def to_representation(self, value: object) -> str:
        request = self.context.get("request")
        allowed = bool(request and self.context.get("payload", True) and reads_payload(request))
        return error_for_viewer(str(value), may_read_payload=allowed)


# --- one pagination -----------------------------------------------------------------------------


class ConsolePagination(CursorPagination):
    """A cursor over the view's `ordering`, `limit` rows a page (a larger one is capped to
    MAX_PAGE_LIMIT; anything but a whole number from 1 is a 400), `next` until it is null.
    A cursor that does not decode, or whose position is no value of the ordering's field, is a
    404. `count` only where the view says counting is cheap."""

    page_size_query_param = "limit"
    max_page_size = MAX_PAGE_LIMIT
    invalid_cursor_message = INVALID_CURSOR
    count: int | None = None

    def paginate_queryset(
        self, queryset: QuerySet, request: Request, view: APIView | None = None
    ) -> list | None:
        assert isinstance(view, ListApi)  # a list view pages its own rows
        self.ordering = view.ordering
        self.page_size = api_settings.PAGE_SIZE
        first = view.ordering[0] if isinstance(view.ordering, tuple) else view.ordering
        self.position_field = queryset.model._meta.get_field(first.lstrip("-"))
        self.count = queryset.count() if view.count_is_cheap(request) else None
        return super().paginate_queryset(queryset, request, view)

    def get_page_size(self, request: Request) -> int:
        given = request.query_params.get(self.page_size_query_param)
        if given is None:
            return int(api_settings.PAGE_SIZE or 50)
        if not given.isdigit() or int(given) < 1:
            raise ValidationError({"limit": [BAD_LIMIT.format(limit=self.max_page_size)]})
        return min(int(given), self.max_page_size)

    def decode_cursor(self, request: Request) -> Cursor | None:
        encoded = request.query_params.get(self.cursor_query_param)
        if encoded is None:
            return None
        try:
            tokens = parse.parse_qs(b64decode(encoded.encode("ascii")).decode("ascii"), True)
        except (UnicodeError, binascii.Error, ValueError) as exc:
            raise NotFound(self.invalid_cursor_message) from exc
        # DRF reads a cursor of junk that decodes as "the first page": refused instead.
        if not tokens or not set(tokens) <= {"o", "r", "p"}:
            raise NotFound(self.invalid_cursor_message)
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            try:
                self.position_field.to_python(cursor.position)
            except DjangoValidationError as exc:
                raise NotFound(self.invalid_cursor_message) from exc
        return cursor

    def get_paginated_response(self, data: object) -> Response:
        body: dict[str, object] = {
            "next": self.get_next_link(),
            "previous": self.get_previous_link(),
            "results": data,
        }
        return Response(body if self.count is None else {"count": self.count, **body})

    def get_paginated_response_schema(self, schema: dict) -> dict:
        response = super().get_paginated_response_schema(schema)
        response["properties"]["count"] = {
            "type": "integer",
            "description": "Every row the filters select; absent where counting is not cheap.",
        }
        response["required"] = ["next", "previous", "results"]
        return response

    def get_schema_operation_parameters(self, view: APIView) -> list:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == "limit":
                parameter["schema"] = {"type": "integer", "minimum": 1}
        return parameters


# --- one way to filter ----------------------------------------------------------------------------


class WindowForm(forms.Form):
    """`<x>_after` must come before `<x>_before`."""

    def clean(self) -> dict:
        data = super().clean() or {}
        for name in self.fields:
            if name.endswith("_after"):
                window = name.removesuffix("_after")
                after, before = data.get(name), data.get(f"{window}_before")
                if after and before and after >= before:
                    self.add_error(f"{window}_before", WINDOW_ORDER.format(after=name))
        return data


class ConsoleFilterSet(filters.FilterSet):
    """A kind of row's filters: the API list's query string, a bulk job's stored selection and
    the job form all go through its FilterSet."""

    class Meta:
        form = WindowForm


def choice(choices: object, **kwargs: object) -> filters.ChoiceFilter:
    """A choice filter saying what DRF says of a wrong choice."""
    messages = {"invalid_choice": '"%(value)s" is not a valid choice.'}
    return filters.ChoiceFilter(choices=choices, error_messages=messages, **kwargs)


class IdFilter(filters.NumberFilter):
    field_class = forms.IntegerField

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, min_value=1, max_value=MAX_ID, **kwargs)


class ConsoleFilterBackend(filters.DjangoFilterBackend):
    """django-filter's backend, refusing a misspelt filter (a 400 naming it) instead of
    answering an unfiltered list."""

    def get_filterset(self, request: Request, queryset: QuerySet, view: APIView) -> object:
        filterset_class = self.get_filterset_class(view, queryset)
        known = set(filterset_class.base_filters) if filterset_class else set()
        unknown = sorted(set(request.query_params) - known - PAGE_PARAMS)
        if unknown:
            raise ValidationError({name: [UNKNOWN_FILTER] for name in unknown})
        return super().get_filterset(request, queryset, view)


class ListApi(ConsoleApi, generics.ListAPIView):
    """A list: the FilterSet filters, one cursor pages newest first."""

    ordering: str | tuple[str, ...] = "-id"
    filter_backends = [ConsoleFilterBackend]
    pagination_class = ConsolePagination

    def count_is_cheap(self, request: Request) -> bool:
        return True


class DetailApi(ConsoleApi, generics.RetrieveAPIView):
    lookup_url_kwarg = "pk"


# --- operator actions ---------------------------------------------------------------------------


class OperatorActionOutputSerializer(serializers.ModelSerializer):
    class Meta:
        model = OperatorAction
        fields = (
            "id",
            "actor_username",
            "action",
            "via",
            "target_model",
            "target_ids",
            "requested",
            "succeeded",
            "refused",
            "failed",
            "outcome",
            "results",
            "note",
            "started_at",
            "finished_at",
        )


def operator_action_answer(record: OperatorAction) -> Response:
    """A one-object change (a pause, an incident's acknowledgement): the recorded operator
    action, or, refused, a 409 problem saying why, with the action that recorded it."""
    data = OperatorActionOutputSerializer(record).data
    if record.succeeded:
        return Response(data)
    return problem(409, record.results[0]["detail"], code="refused", operator_action=data)


class IdsInputSerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
        allow_empty=False,
        max_length=BULK_LIMIT,
    )


class OperatorActionApi(ConsoleApi):
    """POST {"ids": [...], ...}: one operator action, run and recorded by its service (the
    admin's confirmation page runs the same one from console.services.OPERATOR_ACTIONS)."""

    required_permission = "console.operate"
    serializer_class: type[serializers.Serializer] = IdsInputSerializer
    action: str  # OperatorActionKind

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return self.serializer_class  # the request body, as the schema shows it

    @extend_schema(responses=OperatorActionOutputSerializer)
    def post(self, request: Request) -> Response:
        serializer = self.serializer_class(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        try:
            record = OPERATOR_ACTIONS[self.action](
                actor=acting_user(request.user),
                ids=data["ids"],
                via=OperatorActionVia.API,
                # The operator's note: mark dead's required reason.
                note=data.get("reason", ""),
            )
        except OperatorActionError as exc:
            # Unknown ids, too many, none: nothing was done and nothing recorded.
            raise ValidationError({"ids": [str(exc)]}) from exc
        return Response(OperatorActionOutputSerializer(record).data)


# --- the root: every endpoint of the URLconf ----------------------------------------------------


def api_endpoints() -> list[tuple[str, type[APIView]]]:
    """(path, view) of every endpoint of console/urls.py, in its order: what the root lists."""
    found = []
    for pattern in get_resolver("console.urls").url_patterns:
        view = getattr(pattern.callback, "view_class", None)
        if view is not None and view is not ApiNotFound:
            # A route's parameters as URI templates: /api/jobs/{job_id}/
            found.append((re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", f"/api/{pattern.pattern}"), view))
    return found


class ApiRootApi(ConsoleApi):
    """Every endpoint, with what it is, the permissions it needs and whether the caller has
    them (reads: `permission`; writes, where another: `write_permission`)."""

    def get_permissions(self) -> list:
        return [IsAdminUser()]

    @extend_schema(
        responses=inline_serializer(
            "ApiRoot",
            {
                "endpoints": inline_serializer(
                    "ApiEndpoint",
                    {
                        "url": serializers.CharField(),
                        "methods": serializers.ListField(child=serializers.CharField()),
                        "what": serializers.CharField(),
                        "permission": serializers.CharField(),
                        "write_permission": serializers.CharField(),
                        "allowed": serializers.BooleanField(),
                    },
                    many=True,
                )
            },
        )
    )
    def get(self, request: Request) -> Response:
        endpoints = []
        for path, view in api_endpoints():
            needed = getattr(view, "required_permission", "")
            writes = getattr(view, "write_permission", "")
            methods = [m.upper() for m in ("get", "post") if hasattr(view, m)]
            endpoints.append(
                {
                    "url": request.build_absolute_uri(path),
                    "methods": methods,
                    "what": (view.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "),
                    "permission": needed,
                    "write_permission": writes,
                    "allowed": not needed or request.user.has_perm(needed),
                }
            )
        return Response({"endpoints": endpoints})


# --- the schema ---------------------------------------------------------------------------------

PROBLEM_SCHEMA = {
    "type": "object",
    "description": "RFC 9457 problem details (kernel/problems.py).",
    "properties": {
        "type": {"type": "string", "description": "urn:eventdrop:problem:<code>"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {
            "type": "object",
            "description": "Validation only: each field that was wrong, with its messages.",
            "additionalProperties": True,
        },
        "operator_action": {
            "type": "object",
            "description": "A refusal (409) of a recorded change: the operator action.",
            "additionalProperties": True,
        },
    },
    "required": ["type", "title", "status", "detail"],
}
# The answers any console endpoint can give, by method, besides its own success.
COMMON = {
    "400": "Bad input: `errors` names each field.",
    "401": "No valid credentials (WWW-Authenticate: Token).",
    "403": "Not staff, a permission missing, or a cross-site write.",
    "404": "No such object (or an invalid cursor).",
    "405": "Method not allowed.",
    "406": "Only JSON is served.",
    "500": "Unexpected error, logged with its traceback.",
    "503": "The database is unavailable (Retry-After).",
}
WRITES = {
    "409": "Refused: the change does not apply now (the operator action says why).",
    "415": "Only JSON bodies are accepted.",
}


class ConsoleTokenScheme(OpenApiAuthenticationExtension):
    target_class = "console.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: object) -> dict:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <token>` (manage.py api_token issue)",
        }


def console_endpoints_only(endpoints: list, **kwargs: object) -> list:
    """The console API, without the catch-all 404."""
    return [
        (path, path_regex, method, callback)
        for path, path_regex, method, callback in endpoints
        if path.startswith("/api/") and getattr(callback, "cls", None) is not ApiNotFound
    ]


def problem_responses(result: dict, generator: object, request: object, public: bool) -> dict:
    """Every operation documents the problem answers it can give (schemathesis checks that
    no answer is undocumented)."""
    result.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    answer = {PROBLEM_CONTENT_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            answers = dict(COMMON, **(WRITES if method in ("post", "put", "patch") else {}))
            responses = operation.setdefault("responses", {})
            for code, description in answers.items():
                responses.setdefault(code, {"description": description, "content": answer})
    return result


class SchemaApi(SpectacularAPIView):
    """This API as OpenAPI 3 (its names, not its data)."""

    permission_classes = [IsAdminUser]
    renderer_classes = [OpenApiJsonRenderer]  # JSON, as every other answer of the API


class ApiNotFound(APIView):
    """Any path under /api/ that is no endpoint: a 404 problem, like every other error."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    def initial(self, request: Request, *args: object, **kwargs: object) -> None:
        raise NotFound()
