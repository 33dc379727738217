"""What keeps another site from driving any of the project's JSON APIs (the console's staff
API and the buyer API), whatever credentials a browser attaches (docs/security.md).

Credentials are the project's defaults (REST_FRAMEWORK): a token for scripts, the session
with Django's CSRF check for browsers, never HTTP Basic, which a browser caches and replays
on requests another site's page makes. On top of them:

- `SameSiteWrites`: a write whose `Origin` or `Sec-Fetch-Site` says another site's page sent
  it is a 403;
- `BoundedJSONParser`: JSON is the only body a write is parsed from (a form, the one write a
  page elsewhere can send without a CORS preflight, is a 415), and a body nested too deeply
  is a 400, not a 500;
- `require_json`: a write must say it is JSON even when it has no body, since DRF parses
  nothing (and so refuses nothing) for an empty one.
"""

from collections.abc import Mapping
from typing import IO, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.utils.http import is_same_domain
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import JSONParser
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

CROSS_SITE_FORBIDDEN = "Cross-site writes are refused: send the request from this site."
# Sec-Fetch-Site values a browser sends for a request this site's own pages (or the user,
# typing a URL) started; scripts send no such header at all.
OWN_FETCH_SITES = {"same-origin", "none"}
NESTED_TOO_DEEP = "JSON parse error - nested too deeply."


def _origin_is_ours(request: Request, origin: str) -> bool:
    if origin == f"{request.scheme}://{request.get_host()}":
        return True
    parsed = urlsplit(origin)
    for trusted in settings.CSRF_TRUSTED_ORIGINS:
        if "*" in trusted:
            # As Django's CSRF check reads them: https://*.example.com
            wanted = urlsplit(trusted)
            if parsed.scheme == wanted.scheme and is_same_domain(parsed.netloc, wanted.netloc):
                return True
        elif origin == trusted:
            return True
    return False


class SameSiteWrites(BasePermission):
    """A write must not come from another site's page, whatever credentials it carries.

    Browsers label every request with `Sec-Fetch-Site` and (on writes) `Origin`; a script
    sends neither and is judged by its token alone. The session's CSRF check covers
    browsers already; this covers every other way credentials might ride along.
    """

    message = CROSS_SITE_FORBIDDEN

    def has_permission(self, request: Request, view: APIView) -> bool:
        if request.method in SAFE_METHODS:
            return True
        fetch_site = request.META.get("HTTP_SEC_FETCH_SITE")
        if fetch_site is not None and fetch_site not in OWN_FETCH_SITES:
            return False
        origin = request.META.get("HTTP_ORIGIN")
        return origin is None or _origin_is_ours(request, origin)


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, with a body nested too deeply to decode answered as malformed:
    the json module raises RecursionError there, not the ValueError DRF turns into a 400,
    so `[[[[…]]]]` a few hundred kilobytes long was a 500."""

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping | None = None
    ) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise ParseError(NESTED_TOO_DEEP) from exc


def require_json(request: Request) -> None:
    """415 for a write not declared `application/json`, with a body or without one."""
    if request.method in SAFE_METHODS:
        return
    media_type = (request.content_type or "").partition(";")[0].strip().lower()
    if media_type != BoundedJSONParser.media_type:
        raise UnsupportedMediaType(media_type)
