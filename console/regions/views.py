"""The regions page (/ops/regions/): who processes, what each region has acknowledged, its
lease, the replication lag per direction; the planned switch and the takeover as buttons,
through the API's own service (console/regions/services.py: the same guard, the same audit).
Seeing it needs `console.view_ops`, switching `console.operate`."""

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from console.jobs.views import WRITE_PERMISSION, _require, page_context
from console.models import OperatorActionVia
from console.ops.figures import VIEW_OPS_PERMISSION
from console.regions.services import processing_region_switch
from console.services import OperatorActionError, acting_user
from kernel.processing_region import ProcessingWritesRefused
from regions.configuration import multi_region, peers, region_name
from regions.models import RegionState
from regions.selectors import effective_decision, replication_lags


@never_cache
@staff_member_required
def region_list(request: HttpRequest) -> TemplateResponse:
    _require(request, VIEW_OPS_PERMISSION)
    decision = effective_decision()
    epoch = decision.epoch if decision else 0
    regions = [
        {"state": state, "acknowledged": state.seen_epoch >= epoch}
        for state in RegionState.objects.order_by("name")
    ]
    context = page_context(
        request,
        "Regions",
        multi_region=multi_region(),
        region=region_name(),
        decision=decision,
        epoch=epoch,
        regions=regions,
        lags=replication_lags(timezone.now()),
        peers=[peer.name for peer in peers()],
    )
    return TemplateResponse(request, "console/regions.html", context)


@staff_member_required
@require_POST
def region_switch(request: HttpRequest) -> HttpResponse:
    """The planned switch (to a named region) or the takeover (`peer_lost`: this region, the
    other declared lost), each with its reason; refusals are the service's messages."""
    _require(request, WRITE_PERMISSION)
    try:
        record = processing_region_switch(
            actor=acting_user(request.user),
            via=OperatorActionVia.ADMIN,
            region=request.POST.get("region", ""),
            reason=request.POST.get("reason", ""),
            peer_lost=request.POST.get("peer_lost") == "1",
        )
    except (OperatorActionError, ProcessingWritesRefused) as exc:
        messages.error(request, str(exc))
    else:
        detail = record.results[0]["detail"]
        (messages.success if record.succeeded else messages.error)(request, detail)
    return HttpResponseRedirect(reverse("console-regions"))
