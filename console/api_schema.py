"""The console API's OpenAPI schema (drf-spectacular), and the API's own 404.

GET /api/schema/ serves it to staff; docs/openapi.json is the committed copy, and
tests/console/test_api_schema.py fails when the two differ (regenerate it with
`manage.py spectacular --file docs/openapi.json --format openapi-json`) and runs
schemathesis against it. Every operation documents the problem-details answers
(kernel/problems.py) it can give besides its own.
"""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.renderers import OpenApiJsonRenderer
from drf_spectacular.views import SpectacularAPIView
from rest_framework.exceptions import NotFound
from rest_framework.permissions import AllowAny, IsAdminUser
from rest_framework.request import Request
from rest_framework.views import APIView

from kernel.problems import PROBLEM_CONTENT_TYPE

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
    problem = {PROBLEM_CONTENT_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            answers = dict(COMMON, **(WRITES if method in ("post", "put", "patch") else {}))
            responses = operation.setdefault("responses", {})
            for code, description in answers.items():
                responses.setdefault(code, {"description": description, "content": problem})
    return result


class SchemaApi(SpectacularAPIView):
    """The schema, for staff (it names every endpoint and filter, not data)."""

    permission_classes = [IsAdminUser]
    renderer_classes = [OpenApiJsonRenderer]  # JSON, as every other answer of the API


class ApiNotFound(APIView):
    """Any path under /api/ that is no endpoint: a 404 problem, like every other error."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    def initial(self, request: Request, *args: object, **kwargs: object) -> None:
        raise NotFound()
