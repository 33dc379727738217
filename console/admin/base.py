"""The confirmation flow every operator action in the admin goes through, and the base of
every console ModelAdmin.

Like Django's "delete selected": the first POST (from the changelist or a detail page's
button) shows how many rows the action will touch, how they split by status, and asks for
confirmation; the second POST (`post=yes`) calls the console service and reports per-row
outcomes as admin messages, linked to the OperatorAction that recorded it.

The confirmation page posts back the exact ids it counted, never "all matching the
filter": rows arriving between the two clicks are not silently included.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import PAGE_VAR
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme

from console.models import ItemOutcome, OperatorAction, OperatorActionOutcome, OperatorActionVia
from console.presentation import EMPTY, format_time_parts, may_read_payload, status_tone
from console.selectors import operator_actions_on
from console.services import (
    BULK_LIMIT,
    NOTE_REQUIRED,
    OPERATOR_ACTIONS,
    TOO_MANY_SELECTED,
    OperatorActionError,
    acting_user,
    payload_access_record,
)
from kernel.processing_region import ProcessingWritesRefused

# At most this many selected rows are listed by name on the confirmation page; all of them
# are counted and all of them are acted on.
LISTED_OBJECTS = 50
# At most this many refusals/errors are spelled out in the result message.
DETAILED_RESULTS = 10

ACTION_RECORDED = "{verb}: {succeeded} succeeded, {refused} refused, {failed} failed"
OPERATE_PERMISSION = "console.operate"


class NoWrites:
    """No add, change or delete through the admin: the rows are written by services only."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class UncountedPaginator(Paginator):
    """Pages without a total: counts the rows no further than one past the next page, so a
    list costs its page (and the pages before it) at any size of the store. The list says
    "more" instead of a total (console/admin/change_list.html)."""

    def __init__(self, object_list, per_page, *, page_number: int = 1, **kwargs) -> None:
        super().__init__(object_list, per_page, **kwargs)
        self.page_number = page_number

    @cached_property
    def count(self) -> int:
        limit = (self.page_number + 1) * self.per_page + 1
        return cast(QuerySet, self.object_list)[:limit].count()

    @property
    def has_more(self) -> bool:
        return self.count > self.page_number * self.per_page


class OperatorAdmin(NoWrites, admin.ModelAdmin):
    """Rows written only by services: no add, change or delete (so no "delete selected").

    Actions declared with `permissions=["operate"]` are offered to users holding
    `console.operate`, and every one of them goes through confirm_operator_action().
    Lists never count the store: no total, no facets (docs/console.md, "What a page costs").
    """

    paginator = UncountedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    def get_paginator(self, request, queryset, per_page, orphans=0, allow_empty_first_page=True):
        page = request.GET.get(PAGE_VAR, "1")
        return self.paginator(
            queryset,
            per_page,
            page_number=int(page) if page.isdigit() else 1,
            orphans=orphans,
            allow_empty_first_page=allow_empty_first_page,
        )

    def has_operate_permission(self, request):
        return request.user.has_perm(OPERATE_PERMISSION)

    @admin.display(description="operator actions")
    def operator_actions(self, obj) -> str:
        """A detail field: who acted on this row from the console, and how it went."""
        return render_operator_actions(obj)


class PayloadAdmin:
    """The payload rule in the admin (the API's is console.api's ReadsPayload): bodies, headers,
    a body's hash and a handler's message are shown to payload readers only, each showing
    recorded before it leaves (console.PayloadAccess); others see payload-free stand-ins."""

    def reads_payload(self, request: HttpRequest) -> bool:
        return may_read_payload(request.user)

    def record_payload_access(self, request: HttpRequest, kind: str, **what) -> None:
        payload_access_record(
            actor=acting_user(request.user), kind=kind, via=OperatorActionVia.ADMIN, **what
        )

    def payload_free(self, request: HttpRequest, names, stand_ins: dict[str, str]) -> tuple:
        """`names`, each payload field swapped for its stand-in unless the user may read."""
        if self.reads_payload(request):
            return tuple(names)
        return tuple(stand_ins.get(name, name) for name in names)


class ReadOnlyInline(NoWrites, admin.TabularInline):
    extra = 0
    can_delete = False


@dataclass(frozen=True)
class ConfirmSpec:
    action: str  # the OperatorActionKind run, from console.services.OPERATOR_ACTIONS
    verb: str  # "Replay", "Re-verify", ... — the button and the result message
    description: str  # one sentence: what happens to each selected row
    # (label, how many) of the selection, e.g. by status: called as breakdown(ids=...).
    breakdown: Callable[..., list[tuple[str, int]]] | None = None
    warnings: Sequence[str] = field(default_factory=tuple)
    note_label: str = ""  # non-empty: a reason is asked for, required, and recorded


def operator_action(spec: ConfirmSpec, *, menu_label: str) -> Callable:
    """A ModelAdmin action running `spec` through confirm_operator_action(), offered to users
    holding console.operate (OperatorAdmin.has_operate_permission). Assign it in the class
    body under the name listed in `actions`."""

    def action(modeladmin, request, queryset):
        return confirm_operator_action(modeladmin, request, queryset, spec)

    action.confirm_spec = spec  # type: ignore[attr-defined]  # read by the registry tests
    return admin.action(description=menu_label, permissions=["operate"])(action)


@dataclass(frozen=True)
class ObjectAction:
    """A detail page's button for one of a changelist's operator actions on this object.

    It posts what the list's action menu posts (the action's name and this object's id) to
    that list, so confirm_operator_action() runs with the same permission check, the same
    confirmation and the same service call and audit record; `next` brings the user back.
    """

    button_id: str  # the button's DOM id
    label: str
    action: str  # the ModelAdmin action's name, e.g. "rearm_selected"
    changelist: str  # the list's URL name, e.g. "admin:outbox_recapsideeffect_changelist"
    object_id: int | str

    @property
    def changelist_url(self) -> str:
        return reverse(self.changelist)


def object_actions_context(request: HttpRequest, actions: Sequence[ObjectAction]) -> dict:
    """The change form's extra context: the buttons, only for users who may operate (the
    action itself checks again, on the list)."""
    allowed = request.user.has_perm(OPERATE_PERMISSION)
    return {"object_actions": list(actions) if allowed else []}


def render_operator_actions(obj) -> str:
    """The latest operator actions on one object, with this object's own outcome in each."""
    pk = obj.pk if isinstance(obj.pk, int) else str(obj.pk)
    actions = operator_actions_on(target_model=obj._meta.label_lower, object_id=pk)
    rows = [
        (action, next((item for item in action.results if item["id"] == pk), None))
        for action in actions
    ]
    return render_to_string("console/admin/object_operator_actions.html", {"rows": rows})


def _safe_next(request: HttpRequest) -> str | None:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return None


def _report(request: HttpRequest, spec: ConfirmSpec, record: OperatorAction) -> None:
    link = reverse("admin:console_operatoraction_change", args=[record.pk])
    summary = ACTION_RECORDED.format(
        verb=spec.verb,
        succeeded=record.succeeded,
        refused=record.refused,
        failed=record.failed,
    )
    levels: dict[str, int] = {
        OperatorActionOutcome.SUCCEEDED: messages.SUCCESS,
        OperatorActionOutcome.PARTIAL: messages.WARNING,
        OperatorActionOutcome.REFUSED: messages.ERROR,
        OperatorActionOutcome.FAILED: messages.ERROR,
    }
    level = levels[record.outcome]
    messages.add_message(
        request,
        level,
        format_html(
            '{} (recorded as <a href="{}">operator action #{}</a>).', summary, link, record.pk
        ),
    )
    for item in record.results:
        if item["outcome"] == ItemOutcome.OK and len(record.results) <= DETAILED_RESULTS:
            messages.info(request, f"#{item['id']}: {item['detail']}")
    problems = [item for item in record.results if item["outcome"] != ItemOutcome.OK]
    for item in problems[:DETAILED_RESULTS]:
        messages.add_message(request, level, f"#{item['id']}: {item['detail']}")
    if len(problems) > DETAILED_RESULTS:
        messages.add_message(
            request, level, f"… and {len(problems) - DETAILED_RESULTS} more, see the record."
        )


def confirm_operator_action(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet,
    spec: ConfirmSpec,
) -> HttpResponse | None:
    """Render the confirmation page, or (on `post=yes`) run the action and report it."""
    ids = list(queryset.order_by("-pk").values_list("pk", flat=True)[: BULK_LIMIT + 1])
    if len(ids) > BULK_LIMIT:
        modeladmin.message_user(
            request,
            TOO_MANY_SELECTED.format(count=f"More than {BULK_LIMIT}", limit=BULK_LIMIT),
            messages.ERROR,
        )
        return None

    note = request.POST.get("note", "").strip()
    error = ""
    if request.POST.get("post") == "yes":
        if spec.note_label and not note:
            error = NOTE_REQUIRED
        else:
            try:
                record = OPERATOR_ACTIONS[spec.action](
                    actor=acting_user(request.user), ids=ids, via=OperatorActionVia.ADMIN, note=note
                )
            except (OperatorActionError, ProcessingWritesRefused) as exc:
                # Nothing was done and nothing recorded (the standby region refuses every
                # action that writes processing state, naming the processing region).
                modeladmin.message_user(request, str(exc), messages.ERROR)
                return None
            _report(request, spec, record)
            target = _safe_next(request)
            return HttpResponseRedirect(target) if target else None

    opts = modeladmin.model._meta
    listed = list(queryset.order_by("-pk")[:LISTED_OBJECTS])
    noun = opts.verbose_name if len(ids) == 1 else opts.verbose_name_plural
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": f"{spec.verb} {len(ids)} {noun}?",
        "subtitle": None,
        "opts": opts,
        "spec": spec,
        "count": len(ids),
        "ids": ids,
        "listed": [
            (obj, reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]))
            for obj in listed
        ],
        "unlisted": max(len(ids) - len(listed), 0),
        "breakdown": spec.breakdown(ids=ids) if spec.breakdown else [],
        "action_name": request.POST.get("action", ""),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "next": _safe_next(request) or "",
        "note": note,
        "error": error,
        "media": modeladmin.media,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, "console/admin/confirm_action.html", context)


# --- one look: statuses, times, clipped text (every console list and page) -----------------


def tone_badge(tone: str, label: str) -> str:
    # The word says it; the colour repeats it (console/admin/console_styles.html).
    return format_html('<span class="console-badge console-tone-{}">{}</span>', tone, label)


def status_badge(status: str, label: str = "") -> str:
    return tone_badge(status_tone(status), label or status)


def time_field(field: str, description: str) -> Callable:
    """A ModelAdmin display of the time in `field` (console.presentation.format_time)."""

    @admin.display(description=description, ordering=field)
    def display(modeladmin, obj) -> str:
        value = getattr(obj, field)
        if value is None:
            return EMPTY
        # The same words as format_time; a list stacks the age under the time (narrower).
        stamp, relative = format_time_parts(value, timezone.now())
        return format_html(
            '<span class="console-time">{}</span><span class="console-age"> · {}</span>',
            stamp,
            relative,
        )

    return display


def status_field(field: str, description: str) -> Callable:
    """A ModelAdmin display of the status in `field` as the console's badge."""

    @admin.display(description=description, ordering=field)
    def display(modeladmin, obj) -> str:
        value = getattr(obj, field)
        return status_badge(value) if value else EMPTY

    return display


# A list column shows this much; the tooltip and the row's page all of it.
LIST_TEXT_CHARS = 60
LIST_ID_CHARS = 8


def clipped(text: str, limit: int = LIST_TEXT_CHARS) -> str:
    """`text` cut to `limit` characters for a list column, whole in its tooltip."""
    if not text:
        return EMPTY
    if len(text) <= limit:
        return text
    return format_html('<span title="{}">{}…</span>', text, text[: limit - 1])


class LastErrorColumn:
    """The `short_error` list column of a model with a `last_error` text field."""

    @admin.display(description="last error")
    def short_error(self, obj) -> str:
        return clipped(obj.last_error)
