"""The audit trail, read-only: rows are written by console.services and never edited."""

import json

from django.contrib import admin
from django.contrib.admin import DateFieldListFilter
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse

from console.admin_actions import OperatorAdmin
from console.models import OperatorAction


@admin.register(OperatorAction)
class OperatorActionAdmin(OperatorAdmin):
    list_display = (
        "id",
        "started_at",
        "actor_username",
        "action",
        "via",
        "target_model",
        "requested",
        "succeeded",
        "refused",
        "failed",
        "outcome",
    )
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
