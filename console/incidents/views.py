"""The incidents pages (/ops/incidents/): failures grouped, acknowledged, resolved, re-armed.

In the admin's frame like the other /ops/ pages. Seeing incidents needs `console.view_ops`
(the ops page's permission: they are its dead and stuck rows, grouped); acknowledging,
resolving and re-arming `console.operate`. Each write is a POST with the admin's CSRF
protection, goes through console/incidents/services.py (an audited operator action, or a bulk job's
preview) and answers with a redirect.
"""

from collections.abc import Callable

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from console.incidents import services as incidents
from console.jobs.services import BulkJobError
from console.jobs.views import WRITE_PERMISSION, page_context
from console.models import IncidentKind, OperatorAction, OperatorActionVia
from console.ops.figures import VIEW_OPS_PERMISSION
from console.services import acting_user

# Newest rows of a group listed on its page (its count says how many there are).
LISTED_ROWS = 20


def _require(request: HttpRequest, permission: str) -> None:
    if not request.user.has_perm(permission):
        raise PermissionDenied


@never_cache
@staff_member_required
def incident_list(request: HttpRequest) -> TemplateResponse:
    _require(request, VIEW_OPS_PERMISSION)
    state = request.GET.get("state", "")
    kind = request.GET.get("kind", "")
    if state not in ("", *incidents.STATES) or kind not in ("", *IncidentKind.values):
        raise Http404
    groups = incidents.incident_groups(kind=kind, state=state)
    context = page_context(
        request,
        "Incidents",
        groups=groups,
        state=state,
        kind=kind,
        states=incidents.STATES,
        kinds=IncidentKind.choices,
    )
    return TemplateResponse(request, "console/incidents.html", context)


@never_cache
@staff_member_required
def incident_detail(
    request: HttpRequest, kind: str, scope: str, error_class: str
) -> TemplateResponse:
    _require(request, VIEW_OPS_PERMISSION)
    group = incidents.incident_group_get(kind=kind, scope=scope, error_class=error_class)
    context = page_context(
        request,
        f"Incident: {IncidentKind(kind).label if kind in IncidentKind.values else kind}",
        group=group,
        kind=kind,
        scope=scope,
        error_class=error_class,
        row_ids=incidents.incident_row_ids(group, limit=LISTED_ROWS) if group else [],
    )
    # A group with no rows now is not an error: the alert's link may outlive it.
    return TemplateResponse(request, "console/incident_detail.html", context)


def _back(kind: str, scope: str, error_class: str) -> HttpResponseRedirect:
    return HttpResponseRedirect(incidents.incident_url(kind, scope, error_class))


def _change(
    request: HttpRequest,
    service: Callable[..., OperatorAction],
    kind: str,
    scope: str,
    error_class: str,
) -> HttpResponse:
    _require(request, WRITE_PERMISSION)
    record = service(
        actor=acting_user(request.user),
        via=OperatorActionVia.ADMIN,
        kind=kind,
        scope=scope,
        error_class=error_class,
    )
    detail = record.results[0]["detail"]
    (messages.success if record.succeeded else messages.error)(request, detail)
    return _back(kind, scope, error_class)


@staff_member_required
@require_POST
def incident_acknowledge(
    request: HttpRequest, kind: str, scope: str, error_class: str
) -> HttpResponse:
    return _change(request, incidents.incident_acknowledge, kind, scope, error_class)


@staff_member_required
@require_POST
def incident_resolve(request: HttpRequest, kind: str, scope: str, error_class: str) -> HttpResponse:
    return _change(request, incidents.incident_resolve, kind, scope, error_class)


@staff_member_required
@require_POST
def incident_rearm(request: HttpRequest, kind: str, scope: str, error_class: str) -> HttpResponse:
    """Preview a bulk job over the group's dead rows; it is started on the job's page."""
    _require(request, WRITE_PERMISSION)
    try:
        job = incidents.incident_rearm_preview(
            actor=acting_user(request.user),
            via=OperatorActionVia.ADMIN,
            kind=kind,
            scope=scope,
            error_class=error_class,
        )
    except (incidents.IncidentRefused, BulkJobError) as exc:
        messages.error(request, str(exc))
        return _back(kind, scope, error_class)
    return HttpResponseRedirect(reverse("console-job-detail", args=[job.id]))
