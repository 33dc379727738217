"""One error shape for every JSON API of the project: RFC 9457 problem details.

    {"type": "urn:eventdrop:problem:invalid", "title": "Bad Request", "status": 400,
     "detail": "Invalid input: see errors.", "errors": {"ids": ["This list may not be empty."]}}

`type` names the kind of problem (DRF's error code, stable for scripts to branch on), `title`
is the status's reason phrase, `detail` one sentence for a human, `errors` (validation only)
the fields that were wrong, as DRF reports them. Content-Type `application/problem+json`.

This is DRF's documented extension point (REST_FRAMEWORK["EXCEPTION_HANDLER"]): every error
a DRF view of the project raises (the console API, the buyer API) is a problem, 500s included
— an unexpected exception is logged with its traceback and answered without its message
(which may quote data). The webhook path is not a DRF view: its answers keep their
`{"error", "message"}` body (docs/console.md, "Errors").

drf-standardized-errors was considered: its shape (`{"type", "errors": [{"code", "detail",
"attr"}]}`) is not RFC 9457's, and reshaping it would be more code than this.
"""

import logging
from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import InterfaceError, OperationalError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler, set_rollback

from kernel.processing_region import ProcessingWritesRefused

logger = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:eventdrop:problem:"
DATABASE_UNAVAILABLE = "The database is unavailable; retry later."
INVALID_INPUT = "Invalid input: see errors."
UNEXPECTED = "Unexpected error; it is logged with its traceback (see the server's logs)."


def problem(
    http_status: int, detail: str, *, code: str = "", headers: dict | None = None, **extra: object
) -> Response:
    """A problem-details answer; `extra` members (e.g. `errors`) are added as they are."""
    body = {
        "type": f"{TYPE_PREFIX}{code}" if code else "about:blank",
        "title": HTTPStatus(http_status).phrase,
        "status": http_status,
        "detail": detail,
        **extra,
    }
    return Response(body, status=http_status, headers=headers, content_type=PROBLEM_CONTENT_TYPE)


def _code(exc: APIException) -> str:
    codes = exc.get_codes()
    # A validation error's codes are per field: the problem's kind is "invalid".
    return codes if isinstance(codes, str) else exc.default_code


def problem_exception_handler(exc: Exception, context: dict) -> Response | None:
    """REST_FRAMEWORK["EXCEPTION_HANDLER"]: every DRF error as a problem.

    The database being down is a 503 to retry (Retry-After), not a 500: authentication alone
    needs it (a token or session lookup), so an outage reaches every endpoint. Only
    connection-level failures: an IntegrityError or a refused privilege is a bug or a
    misconfiguration that retrying cannot fix, and stays a 500.
    """
    view = type(context.get("view")).__name__
    if isinstance(exc, OperationalError | InterfaceError):
        logger.error("api.database_unavailable", exc_info=exc, extra={"view": view})
        return problem(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            DATABASE_UNAVAILABLE,
            code="database_unavailable",
            headers={"Retry-After": str(settings.INGRESS_UNAVAILABLE_RETRY_AFTER)},
        )
    if isinstance(exc, ProcessingWritesRefused):
        # Asked before anything is written (docs/multi-region.md, "Writes outside
        # processing"): 409 in the standby region (go to the one named), 503 with
        # Retry-After while a switch to this region completes.
        logger.info(
            "api.processing_writes_refused",
            extra={"view": view, "code": exc.code, "processing_region": exc.processing_region},
        )
        return problem(
            exc.status,
            str(exc),
            code=exc.code,
            headers={"Retry-After": str(exc.retry_after)} if exc.retry_after else None,
            region=exc.region,
            processing_region=exc.processing_region or None,
            epoch=exc.epoch,
        )
    # As DRF's own handler reads them: Django's 404 and permission refusal are API errors.
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(*exc.args)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    response = exception_handler(exc, context)
    if response is None:
        set_rollback()
        logger.error("api.unexpected_error", exc_info=exc, extra={"view": view})
        return problem(status.HTTP_500_INTERNAL_SERVER_ERROR, UNEXPECTED, code="server_error")
    assert isinstance(exc, APIException)  # what DRF's handler answers for
    kept = ("WWW-Authenticate", "Retry-After", "Allow")
    headers = {name: response[name] for name in kept if name in response}
    if isinstance(exc, ValidationError):
        detail = exc.detail
        errors = detail if isinstance(detail, dict) else {"non_field_errors": detail}
        return problem(
            response.status_code, INVALID_INPUT, code="invalid", headers=headers, errors=errors
        )
    return problem(response.status_code, str(exc.detail), code=_code(exc), headers=headers)
