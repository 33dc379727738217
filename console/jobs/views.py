"""Console pages for bulk jobs and handler pauses, in the admin's frame (like /ops/).

Staff only (the admin login otherwise). Reading jobs needs `console.view_operatoraction`,
previewing, starting and cancelling them, and pausing or resuming handlers,
`console.operate`. The form's filters are validated by the kind's FilterSet, as the job's
rows are selected by it and the API's are (console/jobs/services.py): a page and a script are
held to one rule. Every write is a POST with the admin's CSRF
protection and answers with a redirect (no resubmission on reload).
"""

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from console.jobs.services import (
    FILTER_NAMES,
    KINDS,
    READ_PERMISSION,
    STATUSES_PER_KIND,
    WRITE_PERMISSION,
    BulkJobError,
    bulk_job_cancel,
    bulk_job_list,
    bulk_job_preview,
    bulk_job_start,
)
from console.models import BulkJob, BulkJobKind, BulkJobState, OperatorActionVia
from console.presentation import format_seconds
from console.services import acting_user
from ingress.handlers import all_handlers
from ingress.models import DeliveryStatus, RejectionReason
from ingress.sources import all_sources
from kernel.processing_region import ProcessingWritesRefused

# While a job runs its page reloads this often: the progress bar without JavaScript.
PROGRESS_REFRESH_SECONDS = 2
LIST_LIMIT = 100
FORM_FILTERS = (*FILTER_NAMES, "delivery_status")
# The admin lists' "Bulk job from the selected rows" button (console/jobs/links.py):
# it posts the list's action form here with this name and the kind as its value.
PREFILL_FIELD = "bulk_job_prefill"
NOTHING_SELECTED_ON_LIST = (
    "No rows were selected on the list: tick some rows, or use “Bulk job from this filter”."
)
ALL_SELECTED_ON_LIST = (
    "“Select all” on the list selects by its filter, not by ids: use “Bulk job from this "
    "filter” instead."
)
START_QUEUED = "Job #{id} queued: {total} rows, in batches, on a worker."
CANCEL_DONE = "Job #{id}: {state}."


def _require(request: HttpRequest, permission: str) -> None:
    if not request.user.has_perm(permission):
        raise PermissionDenied


def page_context(request: HttpRequest, title: str, **extra) -> dict:
    return {
        **admin.site.each_context(request),
        "title": title,
        "may_operate": request.user.has_perm(WRITE_PERMISSION),
        **extra,
    }


def _form_choices() -> dict:
    return {
        "kinds": BulkJobKind.choices,
        "sources": [
            {"name": source.name, "enabled": source.enabled}
            for source in sorted(all_sources().values(), key=lambda s: s.name)
        ],
        # Each kind's own statuses: the form shows those of the chosen kind only.
        "statuses_per_kind": [
            (kind, label, STATUSES_PER_KIND[BulkJobKind(kind)])
            for kind, label in BulkJobKind.choices
        ],
        "delivery_statuses": DeliveryStatus.values,
        "reasons": RejectionReason.values,
        "handlers": sorted(spec.name for spec in all_handlers()),
        "filters_per_kind": {kind: sorted(spec.filters) for kind, spec in KINDS.items()},
        "disabled_sources": sorted(n for n, source in all_sources().items() if not source.enabled),
    }


BAD_KIND = "kind: choose what the job does."
BAD_IDS = "ids: whole numbers, separated by spaces or commas."


def _preview_from_post(request: HttpRequest) -> tuple[BulkJob | None, list[str]]:
    """The form's kind, filters or ids, previewed: the kind's FilterSet validates the filters
    (console/jobs/services.py), as it selects the job's rows."""
    post = request.POST
    kind = post.get("kind", "")
    if kind not in BulkJobKind.values:
        return None, [BAD_KIND]
    ids = post.get("ids", "").replace(",", " ").split()
    if not all(pk.isdigit() for pk in ids):
        return None, [BAD_IDS]
    filters = {name: post.get(name, "").strip() for name in FORM_FILTERS}
    try:
        job = bulk_job_preview(
            actor=acting_user(request.user),
            kind=kind,
            via=OperatorActionVia.ADMIN,
            filters={} if ids else {name: value for name, value in filters.items() if value},
            target_ids=[int(pk) for pk in ids],
        )
    except BulkJobError as exc:
        return None, [f"{exc.field}: {exc}" if exc.field != "non_field_errors" else str(exc)]
    return job, []


@never_cache
@staff_member_required
def job_list(request: HttpRequest) -> TemplateResponse:
    _require(request, READ_PERMISSION)
    jobs = list(bulk_job_list()[:LIST_LIMIT])
    return TemplateResponse(
        request, "console/jobs_list.html", page_context(request, "Bulk jobs", jobs=jobs)
    )


def _prefill_from_selection(post) -> tuple[dict, list[str]]:
    """The form's values for the rows ticked on an admin list (its action form's POST)."""
    kind = post.get(PREFILL_FIELD, "")
    if post.get("select_across") == "1":
        return {"kind": kind}, [ALL_SELECTED_ON_LIST]
    ids = [value for value in post.getlist("_selected_action") if value.isdigit()]
    if not ids:
        return {"kind": kind}, [NOTHING_SELECTED_ON_LIST]
    return {"kind": kind, "ids": " ".join(ids)}, []


@never_cache
@staff_member_required
def job_new(request: HttpRequest) -> HttpResponse:
    """The job form; POST previews (counts, nothing touched) and shows the preview page.

    A POST from an admin list's selection (PREFILL_FIELD) only fills the form in.
    """
    _require(request, WRITE_PERMISSION)
    errors: list[str] = []
    values: Mapping[str, Any] = request.POST if request.method == "POST" else request.GET
    if request.method == "POST" and PREFILL_FIELD in request.POST:
        values, errors = _prefill_from_selection(request.POST)
    elif request.method == "POST":
        job, errors = _preview_from_post(request)
        if job is not None:
            return HttpResponseRedirect(reverse("console-job-detail", args=[job.id]))
    context = page_context(request, "New bulk job", errors=errors, values=values, **_form_choices())
    return TemplateResponse(
        request, "console/jobs_form.html", context, status=400 if errors else 200
    )


@never_cache
@staff_member_required
def job_detail(request: HttpRequest, job_id: int) -> TemplateResponse:
    _require(request, READ_PERMISSION)
    job = get_object_or_404(bulk_job_list(), pk=job_id)
    context = page_context(
        request,
        f"Bulk job #{job.id}",
        job=job,
        refresh_seconds=PROGRESS_REFRESH_SECONDS if job.is_active else None,
        may_start=job.state == BulkJobState.PREVIEWED,
        may_cancel=job.state in (BulkJobState.PREVIEWED, BulkJobState.QUEUED, BulkJobState.RUNNING),
        slo_p99=format_seconds(job.slo_p99_seconds) if job.slo_p99_seconds is not None else "",
        filters=sorted(job.filters.items()),
        selected_ids=len(job.target_ids),
    )
    return TemplateResponse(request, "console/jobs_detail.html", context)


@staff_member_required
@require_POST
def job_start(request: HttpRequest, job_id: int) -> HttpResponse:
    _require(request, WRITE_PERMISSION)
    job = get_object_or_404(BulkJob, pk=job_id)
    try:
        job = bulk_job_start(job=job, actor=acting_user(request.user), via=OperatorActionVia.ADMIN)
    except (BulkJobError, ProcessingWritesRefused) as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, START_QUEUED.format(id=job.id, total=job.total))
    return HttpResponseRedirect(reverse("console-job-detail", args=[job.id]))


@staff_member_required
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    _require(request, WRITE_PERMISSION)
    job = get_object_or_404(BulkJob, pk=job_id)
    try:
        job = bulk_job_cancel(job=job, actor=acting_user(request.user))
    except BulkJobError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, CANCEL_DONE.format(id=job.id, state=job.get_state_display()))
    return HttpResponseRedirect(reverse("console-job-detail", args=[job.id]))


def job_new_link(**filters: str) -> str:
    """The job form prefilled (from the ops page, say)."""
    return f"{reverse('console-job-new')}?{urlencode(filters)}"
