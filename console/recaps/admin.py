"""The console's view of events, photos and recaps.

Events and their photos are plain data an operator enters and corrects here (an event with
recaps is never deleted: a paid recap would lose what it renders). Recaps are read-only: a
recap's status moves only through recaps.services (payment, redemption, render callbacks)
and the outbox; staff retry a render through console.services, which records who did it,
and can start a free recap of an event for themselves (the demo path, through the same
services as the API). Events and photos are processing state (docs/multi-region.md): in
the standby region every write on their pages is refused with the guard's message.
"""

import uuid
from typing import TYPE_CHECKING, TypedDict

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from console.side_effects.admin import next_attempt_display, recap_link

if TYPE_CHECKING:  # django-stubs' helper for annotated rows (a dev dependency)
    from django_stubs_ext import WithAnnotations
from console.admin.base import (
    LIST_ID_CHARS,
    ConfirmSpec,
    OperatorAdmin,
    ReadOnlyInline,
    clipped,
    operator_action,
    status_badge,
    status_field,
    time_field,
)
from console.models import OperatorActionKind
from console.presentation import EMPTY, trace_link
from console.selectors import recaps_by_status
from kernel.errors import EventDropError
from kernel.processing_region import ProcessingWritesRefused, require_processing_region
from outbox.models import EffectType, RecapSideEffect
from recaps.models import Event, Photo, RecapVideo
from recaps.services import recap_create, recap_redeem_free

RETRY_DESCRIPTION = (
    "Each recap is rendered (again) through the outbox: a missing render row is created, a "
    "pending, dead or stale one is re-armed under the same idempotency key, and a finished "
    "one is re-armed for a new render. A failed recap goes back to paid."
)
RETRY_WARNING = "Recaps that are ready or not paid yet are refused and reported."


class PhotoInline(admin.TabularInline):
    model = Photo
    fields = ("storage_key", "taken_at", "created_at")
    readonly_fields = ("created_at",)
    extra = 1


class EventRecapInline(ReadOnlyInline):
    model = RecapVideo
    fields = ("recap_link", "status", "is_free", "buyer", "updated_at")
    readonly_fields = fields
    verbose_name = "recap"

    @admin.display(description="recap")
    def recap_link(self, obj: RecapVideo) -> str:
        return recap_link(obj.pk)


class ProcessingStateWrites(admin.ModelAdmin):
    """A ModelAdmin whose saves, deletes and actions write processing state: every POST to its
    pages (the change form, the delete confirmation, the list's actions) asks the standby
    guard first, and a refusal is the guard's message on the same page, nothing written."""

    def _refused(self, request: HttpRequest) -> HttpResponse | None:
        if request.method != "POST":
            return None
        try:
            require_processing_region()
        except ProcessingWritesRefused as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        return None

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        return self._refused(request) or super().changeform_view(
            request, object_id, form_url, extra_context
        )

    def delete_view(self, request, object_id, extra_context=None):
        return self._refused(request) or super().delete_view(request, object_id, extra_context)

    def changelist_view(self, request, extra_context=None):
        return self._refused(request) or super().changelist_view(request, extra_context)


def _count(rows: QuerySet) -> Subquery:
    return Subquery(
        rows.order_by().values("event").annotate(n=Count("pk")).values("n")[:1],
        output_field=IntegerField(),
    )


class EventCounts(TypedDict):
    photo_total: int
    recap_total: int


@admin.register(Event)
class EventAdmin(ProcessingStateWrites):
    list_display = ("id", "title", "photo_count", "recap_count", "created_at")
    search_fields = ("title",)
    ordering = ("-created_at",)
    date_hierarchy = "created_at"
    inlines = (PhotoInline, EventRecapInline)
    actions = ("free_recap_for_me",)

    def get_queryset(self, request):
        # A count per row of the page (correlated), not a GROUP BY over every photo and recap.
        return (
            super()
            .get_queryset(request)
            .annotate(
                photo_total=_count(Photo.objects.filter(event=OuterRef("pk"))),
                recap_total=_count(RecapVideo.objects.filter(event=OuterRef("pk"))),
            )
        )

    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.recaps.exists():
            return False
        return super().has_delete_permission(request, obj)

    @admin.display(description="photos", ordering="photo_total")
    def photo_count(self, obj: "WithAnnotations[Event, EventCounts]") -> int:
        return obj.photo_total

    @admin.display(description="recaps", ordering="recap_total")
    def recap_count(self, obj: "WithAnnotations[Event, EventCounts]") -> int:
        return obj.recap_total

    @admin.action(description="Render a free recap of the selected events (for me)")
    def free_recap_for_me(self, request, queryset: QuerySet[Event]):
        for event in queryset:
            try:
                recap = recap_create(event=event, buyer=request.user, is_free=True)
                recap_redeem_free(recap_id=recap.id, user=request.user)
            except EventDropError as exc:
                self.message_user(request, f"{event}: {exc}", messages.ERROR)
                continue
            url = reverse("admin:recaps_recapvideo_change", args=[recap.pk])
            self.message_user(
                request,
                format_html(
                    '{}: free recap <a href="{}">{}</a> queued for rendering', event, url, recap.pk
                ),
                messages.SUCCESS,
            )


@admin.register(Photo)
class PhotoAdmin(ProcessingStateWrites):
    list_display = ("id", "storage_key", "event", "taken_at", "created_at")
    list_filter = (("taken_at", admin.DateFieldListFilter),)
    search_fields = ("storage_key", "event__title")
    list_select_related = ("event",)
    autocomplete_fields = ("event",)
    ordering = ("-created_at",)


class SideEffectInline(ReadOnlyInline):
    model = RecapSideEffect
    fields = (
        "side_effect_link",
        "effect_type",
        "status",
        "attempts",
        "next_attempt",
        "last_error_class",
        "last_error",
        "updated_at",
    )
    readonly_fields = fields
    verbose_name = "side effect"

    @admin.display(description="next attempt")
    def next_attempt(self, obj: RecapSideEffect) -> str:
        # A dead or done row has no next attempt (console/side_effects/admin.py).
        return next_attempt_display(obj)

    @admin.display(description="side effect")
    def side_effect_link(self, obj: RecapSideEffect) -> str:
        url = reverse("admin:outbox_recapsideeffect_change", args=[obj.pk])
        return format_html('<a href="{}">#{} (attempts and errors)</a>', url, obj.pk)


@admin.register(RecapVideo)
class RecapVideoAdmin(OperatorAdmin):
    list_display = (
        "short_id",
        "status_badge",
        "render_state",
        "is_free",
        "payment_reference",
        "paid",
        "event",
        "buyer",
        "updated",
        "short_failure",
    )
    list_display_links = ("short_id",)
    list_filter = (
        "status",
        "is_free",
        ("paid_at", admin.DateFieldListFilter),
        ("updated_at", admin.DateFieldListFilter),
    )
    search_fields = ("payment_reference",)
    search_help_text = "Recap id, payment reference, checkout session id or render id (exact)."
    ordering = ("-updated_at",)
    list_select_related = ("event", "buyer")
    inlines = (SideEffectInline,)
    actions = ("retry_render_selected",)
    fields = (
        "id",
        "status",
        "failure_reason",
        "event",
        "buyer",
        "is_free",
        "payment_reference",
        "checkout_session_id",
        "render_id",
        "video_url",
        "created_at",
        "paid_at",
        "rendering_at",
        "ready_at",
        "failed_at",
        "updated_at",
        "trace",
        "operator_actions",
    )
    readonly_fields = fields

    def get_queryset(self, request):
        # The render row's status in the same query as the list, not one query per row.
        render_status = RecapSideEffect.objects.filter(
            recap=OuterRef("pk"), effect_type=EffectType.RENDER
        ).values("status")[:1]
        return super().get_queryset(request).annotate(render_status=Subquery(render_status))

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(id=uuid.UUID(term)), False
        except ValueError:
            pass
        matches = Q(payment_reference=term) | Q(checkout_session_id=term) | Q(render_id=term)
        return queryset.filter(matches), False

    retry_render_selected = operator_action(
        ConfirmSpec(
            action=OperatorActionKind.RECAP_RETRY_RENDER,
            verb="Retry render",
            description=RETRY_DESCRIPTION,
            warnings=(RETRY_WARNING,),
            breakdown=recaps_by_status,
        ),
        menu_label="Retry render of selected recaps",
    )

    status_badge = status_field("status", "status")
    paid = time_field("paid_at", "paid at")
    updated = time_field("updated_at", "updated at")

    @admin.display(description="id", ordering="id")
    def short_id(self, obj: RecapVideo) -> str:
        # A whole UUID wrapped over four lines of the list: its start, whole in the tooltip.
        text = str(obj.pk)
        return format_html('<span title="{}">{}…</span>', text, text[:LIST_ID_CHARS])

    @admin.display(description="render side effect", ordering="render_status")
    def render_state(self, obj: RecapVideo) -> str:
        render_status = getattr(obj, "render_status", None)
        return status_badge(render_status) if render_status else EMPTY

    @admin.display(description="trace")
    def trace(self, obj: RecapVideo) -> str:
        # The render row carries the recap's trace (the payment's, continued).
        traceparent = (
            RecapSideEffect.objects.filter(recap=obj, effect_type=EffectType.RENDER)
            .values_list("traceparent", flat=True)
            .first()
        )
        return trace_link(traceparent or "")

    @admin.display(description="failure reason")
    def short_failure(self, obj: RecapVideo) -> str:
        return clipped(obj.failure_reason)
