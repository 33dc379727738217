"""The console's view of deliveries: every handler's run of every event, its attempts, its
error (the class to everyone, the message to payload readers, recorded). Read-only: they change
through the inbox's services only (the raw event's Replay re-arms them)."""

from django.contrib import admin
from django.contrib.admin import DateFieldListFilter
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html

from console.admin.base import (
    ConfirmSpec,
    LastErrorColumn,
    ObjectAction,
    OperatorAdmin,
    PayloadAdmin,
    ReadOnlyInline,
    clipped,
    object_actions_context,
    operator_action,
    status_field,
    time_field,
)
from console.deliveries.selectors import deliveries_of_source
from console.jobs.links import deliveries_bulk_job_link
from console.models import OperatorActionKind, PayloadAccessKind
from console.presentation import EMPTY, error_for_viewer, format_time, trace_link
from console.raw_events.admin import NamesFilter, SourceFilter, raw_event_link
from console.selectors import deliveries_by_status
from ingress.handlers import all_handlers
from ingress.models import Delivery, DeliveryAttempt, DeliveryStatus


class DeliverySourceFilter(SourceFilter):
    """A delivery's event's source: what a source's pause holds (the pauses page links here)."""

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(deliveries_of_source(value)) if value else queryset


class HandlerFilter(NamesFilter):
    title = parameter_name = "handler"

    def names(self) -> list[str]:
        return [spec.name for spec in all_handlers()]


class DeliveryAttemptInline(PayloadAdmin, ReadOnlyInline):
    model = DeliveryAttempt
    fields = ("number", "started_at", "finished_at", "outcome", "error", "note")
    readonly_fields = (*fields, "error_without_message")
    ordering = ("started_at", "id")

    def get_fields(self, request: HttpRequest, obj: object = None) -> tuple:
        return self.payload_free(request, self.fields, {"error": "error_without_message"})

    @admin.display(description="error")
    def error_without_message(self, obj: DeliveryAttempt) -> str:
        return error_for_viewer(obj.error, may_read_payload=False) or EMPTY


@admin.register(Delivery)
class DeliveryAdmin(PayloadAdmin, LastErrorColumn, OperatorAdmin):
    list_display = (
        "id",
        "status_badge",
        "event_link",
        "handler_column",
        # The class only, to everyone: a list is not audited (the text is on the page).
        "short_error_without_message",
        "next_attempt_column",
        "attempts",
        "finished",
    )
    list_filter = (
        "status",
        HandlerFilter,
        DeliverySourceFilter,
        ("created_at", DateFieldListFilter),
    )
    search_fields = ("handler",)
    search_help_text = "Raw event id or handler name (exact)."
    # Newest first on the primary key (created_at has no index; ids grow with it).
    ordering = ("-id",)
    show_full_result_count = False
    inlines = (DeliveryAttemptInline,)
    fields = (
        "event_link",
        "handler",
        "status",
        "attempts",
        "next_attempt",
        "claimed_at",
        "created_at",
        # Not updated_at: every delivery write is a QuerySet.update(), which leaves it at
        # the creation time; the attempts below say when each thing happened.
        "finished_at",
        "last_error",
        "trace",
    )
    readonly_fields = (*fields, "last_error_without_message", "status_badge")
    change_list_template = "console/admin/change_list.html"
    change_form_template = "console/admin/operator_change_form.html"
    actions = ("rearm_selected",)

    rearm_selected = operator_action(
        ConfirmSpec(
            action=OperatorActionKind.DELIVERY_REARM,
            verb="Re-arm",
            description=(
                "Each dead delivery becomes due now with fresh attempts; a processing one whose "
                "worker is gone (no heartbeat for CLAIM_HOLDER_TTL_SECONDS) is taken back and "
                "due now, its worker's death counted."
            ),
            warnings=(
                "A delivery a live worker is running is refused and reported: it is left to "
                "that worker.",
            ),
            breakdown=deliveries_by_status,
        ),
        menu_label="Re-arm selected deliveries",
    )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict | None = None
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        extra_context["bulk_job"] = deliveries_bulk_job_link(request)
        return super().changelist_view(request, extra_context=extra_context)

    def get_fields(self, request: HttpRequest, obj: object = None) -> tuple:
        return self.payload_free(request, self.fields, {"last_error": "last_error_without_message"})

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> HttpResponse:
        delivery = self.get_object(request, object_id) if object_id else None
        if delivery is not None and delivery.status in (
            DeliveryStatus.DEAD,
            DeliveryStatus.PROCESSING,
        ):
            extra_context = dict(extra_context or {})
            rearm = ObjectAction(
                "console-rearm",
                "Re-arm",
                "rearm_selected",
                "admin:ingress_delivery_changelist",
                delivery.pk,
            )
            extra_context.update(object_actions_context(request, [rearm]))
        response = super().changeform_view(request, object_id, form_url, extra_context)
        # 200: a delivery's page is about to render, with its handler's error text.
        if object_id and response.status_code == 200 and self.reads_payload(request):
            delivery = self.get_object(request, object_id)
            if delivery is not None and (
                delivery.last_error or any(a.error for a in delivery.history.all())
            ):
                self.record_payload_access(
                    request, PayloadAccessKind.VIEW, raw_event_ids=[delivery.raw_event_id]
                )
        return response

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip().removeprefix("#")
        if not term:
            return queryset, False
        if term.isdigit() and len(term) < 19:
            return queryset.filter(raw_event_id=int(term)), False
        return queryset.filter(handler=term), False

    status_badge = status_field("status", "status")
    finished = time_field("finished_at", "finished")

    @admin.display(description="handler", ordering="handler")
    def handler_column(self, obj: Delivery) -> str:
        # Dotted paths are long: the function names the handler, the tooltip says whose.
        short = obj.handler.rsplit(".", 1)[-1]
        if short == obj.handler:
            return short
        return format_html('<span title="{}">{}</span>', obj.handler, short)

    due = time_field("next_attempt_at", "next attempt")

    @admin.display(description="next attempt", ordering="next_attempt_at")
    def next_attempt_column(self, obj: Delivery) -> str:
        """The list's: the time when pending, else the status (the page says what to do)."""
        if obj.status == DeliveryStatus.PENDING:
            return self.due(obj)
        return f"none: {obj.status}"

    @admin.display(description="next attempt", ordering="next_attempt_at")
    def next_attempt(self, obj: Delivery) -> str:
        # next_attempt_at keeps its last value on done and dead rows, which have none.
        if obj.status == DeliveryStatus.PENDING:
            return format_time(obj.next_attempt_at, timezone.now())
        if obj.status == DeliveryStatus.DEAD:
            return "none: dead (fix the cause, then Replay its event)"
        return f"none: {obj.status}"

    @admin.display(description="raw event", ordering="raw_event_id")
    def event_link(self, obj: Delivery) -> str:
        return raw_event_link(obj.raw_event_id)

    @admin.display(description="trace")
    def trace(self, obj: Delivery) -> str:
        return trace_link(obj.traceparent)

    @admin.display(description="last error")
    def short_error_without_message(self, obj: Delivery) -> str:
        return clipped(error_for_viewer(obj.last_error, may_read_payload=False))

    @admin.display(description="last error")
    def last_error_without_message(self, obj: Delivery) -> str:
        return error_for_viewer(obj.last_error, may_read_payload=False) or EMPTY
