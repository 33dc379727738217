"""The console's view of recaps: status, payment, the render side effect, and a retry.

Read-only: a recap's status moves only through recaps.services (payment, redemption,
render callbacks) and the outbox; staff retry a render through console.services, which
records who did it.
"""

import uuid

from django.contrib import admin
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.urls import reverse
from django.utils.html import format_html

from console.admin_actions import (
    ConfirmSpec,
    OperatorAdmin,
    ReadOnlyInline,
    confirm_operator_action,
    render_operator_actions,
)
from console.models import OperatorActionVia
from console.selectors import recaps_by_status
from console.services import recaps_retry_render
from outbox.models import EffectType, RecapSideEffect
from recaps.models import RecapVideo

RETRY_DESCRIPTION = (
    "Each recap is rendered (again) through the outbox: a missing render row is created, a "
    "pending, dead or stale one is re-armed under the same idempotency key, and a finished "
    "one is re-armed for a new render. A failed recap goes back to paid."
)
RETRY_WARNING = "Recaps that are ready or not paid yet are refused and reported."


class SideEffectInline(ReadOnlyInline):
    model = RecapSideEffect
    fields = (
        "side_effect_link",
        "effect_type",
        "status",
        "attempts",
        "next_attempt_at",
        "last_error_class",
        "last_error",
        "updated_at",
    )
    readonly_fields = fields
    verbose_name = "side effect"

    @admin.display(description="side effect")
    def side_effect_link(self, obj: RecapSideEffect) -> str:
        url = reverse("admin:outbox_recapsideeffect_change", args=[obj.pk])
        return format_html('<a href="{}">#{} (attempts and errors)</a>', url, obj.pk)


@admin.register(RecapVideo)
class RecapVideoAdmin(OperatorAdmin):
    list_display = (
        "id",
        "status",
        "render_state",
        "is_free",
        "payment_reference",
        "paid_at",
        "event",
        "buyer",
        "updated_at",
        "short_failure",
    )
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

    @admin.action(description="Retry render of selected recaps", permissions=["operate"])
    def retry_render_selected(self, request, queryset: QuerySet[RecapVideo]):
        return confirm_operator_action(
            self,
            request,
            queryset,
            ConfirmSpec(
                verb="Retry render",
                description=RETRY_DESCRIPTION,
                warnings=(RETRY_WARNING,),
                breakdown=lambda ids: [
                    (row["status"], row["count"]) for row in recaps_by_status(ids=ids)
                ],
                run=lambda request, ids, note: recaps_retry_render(
                    actor=request.user, recap_ids=ids, via=OperatorActionVia.ADMIN
                ),
            ),
        )

    @admin.display(description="operator actions")
    def operator_actions(self, obj) -> str:
        return render_operator_actions(obj)

    @admin.display(description="render side effect", ordering="render_status")
    def render_state(self, obj: RecapVideo) -> str:
        return getattr(obj, "render_status", None) or "—"

    @admin.display(description="failure reason")
    def short_failure(self, obj: RecapVideo) -> str:
        return obj.failure_reason[:120] + ("…" if len(obj.failure_reason) > 120 else "")
