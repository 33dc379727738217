"""The audit trails, read-only: rows are written by console.services and never edited.

Operator actions (who pushed what back into the pipeline) and payload accesses (who saw or
searched which webhook bodies and headers).
"""

import json

from django.contrib import admin
from django.contrib.admin import DateFieldListFilter
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join
from knox.models import AuthToken

from console.admin.base import OperatorAdmin, status_field, time_field
from console.models import OperatorAction, PayloadAccess
from console.presentation import EMPTY

# A list page shows the first few events a payload access covered; the detail page all.
LISTED_RAW_EVENTS = 20


@admin.register(OperatorAction)
class OperatorActionAdmin(OperatorAdmin):
    list_display = (
        "id",
        "outcome_badge",
        "action",
        "actor_username",
        "started",
        "counts",
        "via",
        "target_model",
    )
    outcome_badge = status_field("outcome", "outcome")
    started = time_field("started_at", "started")

    @admin.display(description="objects")
    def counts(self, obj: OperatorAction) -> str:
        # One column for the four counts (four narrow ones pushed Outcome out of view).
        parts = [f"{obj.succeeded} ok"]
        parts += [
            f"{n} {what}"
            for n, what in (
                (obj.refused, "refused"),
                (obj.failed, "failed"),
                (obj.skipped, "skipped"),
            )
            if n
        ]
        return f"{' · '.join(parts)} of {obj.requested}"

    list_filter = (
        "action",
        "outcome",
        "via",
        ("started_at", DateFieldListFilter),
    )
    search_fields = ("=actor_username",)
    search_help_text = "Username (exact)."
    ordering = ("-started_at", "-id")
    fields = (
        "id",
        "actor_username",
        "actor",
        "action",
        "via",
        "outcome",
        "started_at",
        "finished_at",
        "target_model",
        "target_ids_display",
        "requested",
        "succeeded",
        "refused",
        "failed",
        "note",
        "results_table",
    )
    readonly_fields = fields
    actions = None

    @admin.display(description="target ids")
    def target_ids_display(self, obj: OperatorAction) -> str:
        return json.dumps(obj.target_ids)

    @admin.display(description="results")
    def results_table(self, obj: OperatorAction) -> str:
        app_label, _, model_name = obj.target_model.partition(".")
        rows = []
        for item in obj.results:
            try:
                url = reverse(f"admin:{app_label}_{model_name}_change", args=[item["id"]])
            except NoReverseMatch:
                url = ""
            rows.append((item, url))
        return render_to_string("console/admin/operator_action_results.html", {"rows": rows})


@admin.register(PayloadAccess)
class PayloadAccessAdmin(OperatorAdmin):
    """Auditors' view of who saw or searched webhook payloads (console.view_payloadaccess)."""

    list_display = (
        "id",
        "accessed",
        "actor_username",
        "kind",
        "via",
        "raw_event_links",
        "search_term",
    )
    list_filter = ("kind", "via", ("accessed_at", DateFieldListFilter))
    accessed = time_field("accessed_at", "accessed")
    search_fields = ("=actor_username",)
    search_help_text = "Username (exact)."
    ordering = ("-accessed_at", "-id")
    show_full_result_count = False
    fields = (
        "id",
        "accessed_at",
        "actor_username",
        "actor",
        "kind",
        "via",
        "all_raw_event_links",
        "search_term",
    )
    readonly_fields = fields
    actions = None

    @admin.display(description="raw events")
    def raw_event_links(self, obj: PayloadAccess, limit: int = LISTED_RAW_EVENTS) -> str:
        links = [
            format_html(
                '<a href="{}">#{}</a>', reverse("admin:ingress_rawevent_change", args=[pk]), pk
            )
            for pk in obj.raw_event_ids[:limit]
        ]
        more = len(obj.raw_event_ids) - limit
        if more > 0:
            links.append(format_html("… and {} more", more))
        return format_html_join(", ", "{}", ((link,) for link in links)) or EMPTY

    @admin.display(description="raw events")
    def all_raw_event_links(self, obj: PayloadAccess) -> str:
        return self.raw_event_links(obj, limit=len(obj.raw_event_ids))


# knox's own admin adds tokens and shows the new one in a flash message, which Django keeps in
# a cookie or the session: tokens are issued only by `manage.py api_token`, shown once on a
# terminal. Here they are listed (key, owner, expiry) and nothing else.
admin.site.unregister(AuthToken)


@admin.register(AuthToken)
class ApiTokenAdmin(OperatorAdmin):
    list_display = ("token_key", "user", "created", "expiry")
    list_select_related = ("user",)
    search_fields = ("=token_key", "=user__username")
    search_help_text = "Token key (its first 15 characters) or username (exact)."
    ordering = ("-created",)
    fields = ("token_key", "user", "created", "expiry")
    readonly_fields = fields
    actions = None
