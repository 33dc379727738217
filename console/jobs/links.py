"""From an admin list to a bulk job: the list's filters (or its selection) prefilled in the
job form (/ops/jobs/new/). Not an operator action: the form previews, nothing runs until
the operator starts the job on its own page (console/jobs/views.py, console/jobs/services.py).

The list's query parameters are mapped to the job's filter names. A parameter the job
cannot express (a search, the dispatch status, the provider, ...) is named on the list
beside the link, so that nobody starts a job believing it is narrower than it is.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from django.http import HttpRequest

from console.jobs.views import PREFILL_FIELD, job_new_link
from console.models import BulkJobKind

OPERATE_PERMISSION = "console.operate"
# What the admin's list machinery adds to a URL and is not a filter.
LIST_PARAMETERS = frozenset({"o", "p", "all", "_changelist_filters", "_to_field", "_popup"})


@dataclass(frozen=True)
class BulkJobLink:
    url: str
    unmapped: list[str]  # the list's parameters the job form cannot carry
    kind: str
    selection_field: str = PREFILL_FIELD  # the button's name on the list's action form


# admin list parameter -> job filter name, per kind of job.
RAW_EVENT_FILTERS = {
    "source": "source",
    "event_type": "event_type",
    "signature_status__exact": "status",
    "rejection_reason__exact": "reason",
    "received_at__gte": "received_after",
    "received_at__lt": "received_before",
}
DELIVERY_FILTERS = {
    "status__exact": "status",
    "handler": "handler",
    "source": "source",
}


def bulk_job_link(
    request: HttpRequest, *, kind: str, mapping: Mapping[str, str]
) -> BulkJobLink | None:
    """The job form's URL for the list as filtered now; None without `console.operate`."""
    if not request.user.has_perm(OPERATE_PERMISSION):
        return None
    filters = {"kind": kind}
    unmapped = []
    for name in request.GET:
        value = request.GET.get(name, "")
        if name in LIST_PARAMETERS or value == "":
            continue
        if name == "q":
            unmapped.append("search")
        elif name in mapping:
            filters[mapping[name]] = value
        else:
            unmapped.append(name)
    return BulkJobLink(url=job_new_link(**filters), unmapped=sorted(unmapped), kind=kind)


def raw_events_bulk_job_link(request: HttpRequest) -> BulkJobLink | None:
    return bulk_job_link(request, kind=BulkJobKind.REPLAY_RAW_EVENTS, mapping=RAW_EVENT_FILTERS)


def deliveries_bulk_job_link(request: HttpRequest) -> BulkJobLink | None:
    return bulk_job_link(request, kind=BulkJobKind.REARM_DELIVERIES, mapping=DELIVERY_FILTERS)
