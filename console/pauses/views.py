"""The pauses page (/ops/pauses/): the pauses in force, every handler and source with its
Pause / Resume button. Seeing it needs `console.view_ops`, pausing and resuming
`console.operate`; the work is console/pauses/services.py."""

from collections.abc import Callable

from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from console.jobs.views import WRITE_PERMISSION, _require, page_context
from console.models import OperatorAction, OperatorActionVia
from console.ops.figures import VIEW_OPS_PERMISSION
from console.pauses import services as pauses
from console.presentation import format_seconds
from console.services import acting_user
from ingress.handlers import all_handlers
from ingress.sources import all_sources
from kernel.processing_region import ProcessingWritesRefused


def _pause_scopes() -> tuple[list[dict], list[dict]]:
    """Every handler, and every source with the handlers its provider has: a pause is
    offered only where a handler exists (a source without one has nothing to hold)."""
    handlers = sorted(all_handlers(), key=lambda spec: spec.name)
    sources = [
        {
            "name": source.name,
            "enabled": source.enabled,
            "handlers": [spec.name for spec in handlers if spec.provider == source.provider],
        }
        for source in sorted(all_sources().values(), key=lambda s: s.name)
    ]
    return [{"name": spec.name, "provider": spec.provider} for spec in handlers], sources


def held_deliveries_link(*, handler: str = "", source: str = "") -> str:
    """The delivery list filtered to what a pause of this scope holds."""
    query = {"status__exact": "held", **({"handler": handler} if handler else {"source": source})}
    return f"{reverse('admin:ingress_delivery_changelist')}?{urlencode(query)}"


@never_cache
@staff_member_required
def pause_list(request: HttpRequest) -> TemplateResponse:
    _require(request, VIEW_OPS_PERMISSION)
    active = pauses.pauses_active()
    paused_handlers = {row.pause.handler for row in active if row.pause.handler}
    paused_sources = {row.pause.source for row in active if row.pause.source}
    handlers, sources = _pause_scopes()
    for handler in handlers:
        handler["paused"] = handler["name"] in paused_handlers
    for source in sources:
        source["paused"] = source["name"] in paused_sources
    context = page_context(
        request,
        "Paused handlers",
        pauses=[
            {
                "row": row,
                "held_link": held_deliveries_link(
                    handler=row.pause.handler, source=row.pause.source
                ),
            }
            for row in active
        ],
        handlers=handlers,
        sources=sources,
        source_disable_cost=pauses.SOURCE_DISABLE_COST,
        yellow_after=format_seconds(settings.HANDLER_PAUSE_YELLOW_SECONDS),
        red_after=format_seconds(settings.HANDLER_PAUSE_RED_SECONDS),
    )
    return TemplateResponse(request, "console/pauses.html", context)


PAUSE_NO_HANDLER = "Source {source} has no handler: there is nothing to pause."


@never_cache
@staff_member_required
def pause_handlers(request: HttpRequest) -> HttpResponse:
    """GET: the confirmation page, asking why. POST with a reason: pause, and back to the
    list; POST without one: the confirmation page again, saying the reason is required."""
    _require(request, WRITE_PERMISSION)
    values = request.POST if request.method == "POST" else request.GET
    handler = values.get("handler", "").strip()
    source = values.get("source", "").strip()
    reason = request.POST.get("reason", "").strip()
    if request.method == "POST" and reason:
        return _pause_action(request, pauses.handlers_pause, reason=reason)
    _, sources = _pause_scopes()
    covered = [handler] if handler else []
    if source:
        covered = next((s["handlers"] for s in sources if s["name"] == source), [])
        if not covered:
            # Not offered on the list; a hand-made link is told why.
            messages.error(request, PAUSE_NO_HANDLER.format(source=source))
            return HttpResponseRedirect(reverse("console-pauses"))
    context = page_context(
        request,
        f"Pause {'handler ' + handler if handler else 'source ' + source}?",
        handler=handler,
        source=source,
        covered=covered,
        error=pauses.NOTE_REQUIRED if request.method == "POST" else "",
    )
    status = 400 if request.method == "POST" else 200
    return TemplateResponse(request, "console/pause_confirm.html", context, status=status)


def _pause_action(
    request: HttpRequest, service: Callable[..., OperatorAction], **extra: str
) -> HttpResponse:
    _require(request, WRITE_PERMISSION)
    try:
        record = service(
            actor=acting_user(request.user),
            via=OperatorActionVia.ADMIN,
            handler=request.POST.get("handler", "").strip(),
            source=request.POST.get("source", "").strip(),
            **extra,
        )
    except ProcessingWritesRefused as exc:
        # The standby region: nothing paused, nothing recorded; the message says where to go.
        messages.error(request, str(exc))
        return HttpResponseRedirect(reverse("console-pauses"))
    detail = record.results[0]["detail"]
    if record.succeeded:
        messages.success(request, detail)
    else:
        messages.error(request, detail)
    return HttpResponseRedirect(reverse("console-pauses"))


@staff_member_required
@require_POST
def resume_handlers(request: HttpRequest) -> HttpResponse:
    return _pause_action(request, pauses.handlers_resume)
