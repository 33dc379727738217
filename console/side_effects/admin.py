"""The console's view of the recap outbox: find stuck or dead side effects and re-arm them.

Read-only: rows change only through outbox.services (via console.services, so every re-arm
and mark-dead is recorded). A row's page shows every attempt with its error class and
message, so a dead row explains itself.
"""

import uuid
from datetime import timedelta

from django.conf import settings
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from console.admin.base import (
    LIST_ID_CHARS,
    ConfirmSpec,
    LastErrorColumn,
    ObjectAction,
    OperatorAdmin,
    ReadOnlyInline,
    object_actions_context,
    operator_action,
    status_field,
    time_field,
)
from console.models import OperatorActionKind
from console.presentation import format_seconds, format_time
from console.selectors import side_effects_by_status
from ingress.selectors import any_status
from outbox.models import (
    CircuitBreaker,
    RecapSideEffect,
    RecapSideEffectAttempt,
    SideEffectStatus,
)
from outbox.selectors import QUEUE_STATUSES

REARM_DESCRIPTION = (
    "Each row becomes due now with a fresh set of attempts, under the same idempotency key "
    "(a render the service already accepted is not started twice); a failed recap goes back "
    "to paid. The dispatcher picks the rows up on its next run."
)
REARM_WARNING = (
    "Done rows and rows a live worker is dispatching right now are refused and reported; to "
    "render a done recap again, use “Retry render” on the recap."
)
MARK_DEAD_DESCRIPTION = (
    "Each row stops being retried and its recap becomes failed, with your reason as the "
    "failure reason the buyer's support sees."
)
MARK_DEAD_WARNING = "Done and already dead rows are refused and reported."


class ErrorClassFilter(admin.SimpleListFilter):
    """The error classes of the rows that wait or are dead (their partial indexes), not a
    SELECT DISTINCT over every side effect ever made."""

    title = "last error class"
    parameter_name = "last_error_class"

    def lookups(self, request, model_admin):
        classes = (
            RecapSideEffect.objects.filter(any_status(*QUEUE_STATUSES))
            .exclude(last_error_class="")
            .values_list("last_error_class", flat=True)
            .distinct()
            .order_by("last_error_class")
        )
        return [(name, name) for name in classes]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(last_error_class=value) if value else queryset


class AttemptsFilter(admin.SimpleListFilter):
    title = "attempts"
    parameter_name = "attempts"

    def lookups(self, request, model_admin):
        last = settings.OUTBOX_MAX_ATTEMPTS
        return [*((str(n), str(n)) for n in range(last)), (f"{last}+", f"{last} or more")]

    def queryset(self, request, queryset):
        value = self.value() or ""
        if value.endswith("+") and value[:-1].isdigit():
            return queryset.filter(attempts__gte=int(value[:-1]))
        if value.isdigit():
            return queryset.filter(attempts=int(value))
        return queryset


class AgeFilter(admin.SimpleListFilter):
    """How long the row has been in its current state (updated_at): what "stuck" means."""

    title = "in this state for"
    parameter_name = "state_age"
    AGES = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "1d": timedelta(days=1)}

    def lookups(self, request, model_admin):
        return [("15m", "over 15 minutes"), ("1h", "over an hour"), ("1d", "over a day")]

    def queryset(self, request, queryset):
        age = self.AGES.get(self.value() or "")
        if age is None:
            return queryset
        return queryset.filter(updated_at__lt=timezone.now() - age)


class AttemptInline(ReadOnlyInline):
    model = RecapSideEffectAttempt
    fields = ("number", "outcome", "error_class", "error", "started_at", "finished_at")
    readonly_fields = fields
    ordering = ("id",)
    verbose_name = "attempt"
    verbose_name_plural = "history (every attempt, re-arm and give-up, oldest first)"


@admin.register(RecapSideEffect)
class RecapSideEffectAdmin(LastErrorColumn, OperatorAdmin):
    list_display = (
        "id",
        "status_badge",
        "attempts",
        "recap_link",
        "last_error_class",
        "short_error",
        "next_attempt",
        "state_age",
        "effect_type",
    )
    list_filter = (
        "status",
        ErrorClassFilter,
        AttemptsFilter,
        AgeFilter,
        "effect_type",
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("recap__id",)
    search_help_text = "Side effect id or recap id (exact)."
    # Newest first on the primary key: an order no index served read every row per page.
    ordering = ("-id",)
    list_select_related = ("recap",)
    inlines = (AttemptInline,)
    actions = ("rearm_selected", "mark_dead_selected")
    change_form_template = "console/admin/operator_change_form.html"
    change_list_template = "console/admin/change_list.html"
    fields = (
        "recap_link",
        "recap_status",
        "effect_type",
        "status",
        "attempts",
        "next_attempt",
        "claimed_at",
        "idempotency_key",
        "last_error_class",
        "last_error",
        "created_at",
        "updated_at",
        "finished_at",
        "operator_actions",
    )
    readonly_fields = (*fields, "short_error", "state_age", "status_badge")

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # Act from here, not only from the list: the list's own actions, for this row.
        extra_context = dict(extra_context or {})
        row = self.get_object(request, object_id) if object_id else None
        if row is not None:
            extra_context.update(object_actions_context(request, _side_effect_actions(row)))
        return super().changeform_view(request, object_id, form_url, extra_context)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip().removeprefix("#")
        if not term:
            return queryset, False
        if term.isdigit() and len(term) < 19:
            return queryset.filter(id=int(term)), False
        try:
            return queryset.filter(recap_id=uuid.UUID(term)), False
        except ValueError:
            return queryset.none(), False

    rearm_selected = operator_action(
        ConfirmSpec(
            action=OperatorActionKind.SIDE_EFFECT_REARM,
            verb="Re-arm",
            description=REARM_DESCRIPTION,
            warnings=(REARM_WARNING,),
            breakdown=side_effects_by_status,
        ),
        menu_label="Re-arm selected side effects",
    )
    mark_dead_selected = operator_action(
        ConfirmSpec(
            action=OperatorActionKind.SIDE_EFFECT_MARK_DEAD,
            verb="Mark dead",
            description=MARK_DEAD_DESCRIPTION,
            warnings=(MARK_DEAD_WARNING,),
            breakdown=side_effects_by_status,
            note_label="Reason (kept as the recap's failure reason):",
        ),
        menu_label="Mark selected side effects dead",
    )

    status_badge = status_field("status", "status")

    @admin.display(description="next attempt", ordering="next_attempt_at")
    def next_attempt(self, obj: RecapSideEffect) -> str:
        return next_attempt_display(obj)

    @admin.display(description="recap", ordering="recap_id")
    def recap_link(self, obj: RecapSideEffect) -> str:
        return recap_link(obj.recap_id)

    @admin.display(description="recap status")
    def recap_status(self, obj: RecapSideEffect) -> str:
        recap = obj.recap
        if recap.failure_reason:
            return f"{recap.status}: {recap.failure_reason}"
        return recap.status

    @admin.display(description="in this state for", ordering="updated_at")
    def state_age(self, obj: RecapSideEffect) -> str:
        return format_seconds((timezone.now() - obj.updated_at).total_seconds())


def recap_link(recap_id) -> str:
    """A recap's UUID in a list: its first characters, linked, whole in the tooltip (a whole
    UUID wrapped over four lines of a 1,366 px list)."""
    url = reverse("admin:recaps_recapvideo_change", args=[recap_id])
    text = str(recap_id)
    return format_html('<a href="{}" title="{}">{}…</a>', url, text, text[:LIST_ID_CHARS])


def next_attempt_display(row: RecapSideEffect) -> str:
    """A row's next attempt as the console shows it (this list, the recap's inline).

    next_attempt_at also holds a claimed row's lease, and keeps its last value on done and
    dead rows, which have no next attempt: only a pending row shows it as one."""
    now = timezone.now()
    if row.status == SideEffectStatus.PENDING:
        return format_time(row.next_attempt_at, now)
    if row.status == SideEffectStatus.PROCESSING:
        return f"none while dispatching (reclaimed from {format_time(row.next_attempt_at, now)})"
    if row.status == SideEffectStatus.DEAD:
        return "none: dead (re-arm to try again)"
    return "none: done"


def _side_effect_actions(row: RecapSideEffect) -> list[ObjectAction]:
    """The list's actions that can apply to this row now (the service refuses the rest)."""
    changelist = "admin:outbox_recapsideeffect_changelist"
    actions = []
    # A processing row is re-armed once its worker is gone (the service refuses it before).
    if row.status in (SideEffectStatus.PENDING, SideEffectStatus.DEAD, SideEffectStatus.PROCESSING):
        actions.append(
            ObjectAction("console-rearm", "Re-arm", "rearm_selected", changelist, row.pk)
        )
    if row.status in (SideEffectStatus.PENDING, SideEffectStatus.PROCESSING):
        actions.append(
            ObjectAction("console-mark-dead", "Mark dead", "mark_dead_selected", changelist, row.pk)
        )
    # Retry render is the recap's action (a done row renders again under a new key).
    if row.status in (SideEffectStatus.DONE, SideEffectStatus.DEAD):
        actions.append(
            ObjectAction(
                "console-retry-render",
                "Retry render",
                "retry_render_selected",
                "admin:recaps_recapvideo_changelist",
                str(row.recap_id),
            )
        )
    return actions


@admin.register(CircuitBreaker)
class CircuitBreakerAdmin(OperatorAdmin):
    """Shown so on-call can see why rows are being skipped; changed only by the dispatcher."""

    list_display = (
        "name",
        "state_badge",
        "consecutive_failures",
        "last_error_class",
        "opened",
        "until",
        "updated",
    )
    state_badge = status_field("state", "state")
    opened = time_field("opened_at", "opened at")
    until = time_field("open_until", "open until")
    updated = time_field("updated_at", "updated at")
    readonly_fields = (
        "name",
        "state",
        "consecutive_failures",
        "last_error_class",
        "opened_at",
        "open_until",
        "probe_started_at",
        "updated_at",
    )
