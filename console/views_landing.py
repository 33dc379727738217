"""The landing page at `/` (also where the admin's "View site" goes): the console's front door.

Signed-in staff see what runs (queue depths) and where to go; everyone else a plain page
that says what this host is and names nothing else (no versions, no configuration, no
counts). It lives in the console, which reads every app, rather than in eventdrop, which the
apps import (eventdrop/urls.py only mounts it).
"""

import logging

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest
from django.template.response import TemplateResponse

from console.selectors import queue_depths

logger = logging.getLogger(__name__)


def home(request: HttpRequest) -> TemplateResponse:
    user = request.user
    if not (user.is_active and user.is_staff):
        return TemplateResponse(request, "landing/public.html")
    try:
        depths = queue_depths()
    except DatabaseError as exc:
        # The page still answers: the links are what an operator needs most then.
        logger.warning("landing.queue_depths_failed", extra={"error_class": type(exc).__name__})
        depths = None
    context = {
        "depths": depths,
        "render_service_url": settings.RENDER_SERVICE_URL,
        "stripe_api_base": settings.STRIPE_API_BASE,
        "debug": settings.DEBUG,
        "can_view_ops": user.has_perm("console.view_ops"),
    }
    return TemplateResponse(request, "landing/staff.html", context)
