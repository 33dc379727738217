"""The console on top: one table of operator actions behind the admin and the API, and the
admin pages saying only what is true (issue 10).

- Every operator action the admin offers is an API endpoint too, both running the same
  service from console.services.OPERATOR_ACTIONS (so the same audit record).
- No app below the console imports it: its admins are registered from console/admin/.
- A delivery's page shows no updated_at (QuerySet.update() writes never move it).
- The raw event search help names what the search matches; event types link to a filter.
"""

import ast
from pathlib import Path

import pytest
from django.contrib import admin
from django.urls import reverse

from console import urls
from console.api import OperatorActionApi
from console.services import OPERATOR_ACTIONS
from ingress.inbox import inbox_run_once
from tests.console import samples
from tests.console.conftest import receive_github

ROOT = Path(__file__).resolve().parents[2]
LOWER_APPS = ("ingress", "outbox", "recaps")


def admin_operator_actions() -> dict[str, str]:
    """`app.model.action` -> the OperatorActionKind it runs, for every action that needs
    console.operate."""
    found = {}
    for model, model_admin in admin.site._registry.items():
        for name in model_admin.actions or ():
            function = getattr(type(model_admin), name) if isinstance(name, str) else name
            if "operate" not in getattr(function, "allowed_permissions", ()):
                continue
            label = f"{model._meta.label_lower}.{name}"
            spec = getattr(function, "confirm_spec", None)
            assert spec is not None, f"{label}: not built with admin_actions.operator_action"
            found[label] = spec.action
    return found


def api_operator_actions() -> dict[str, str]:
    """The console API's operator-action endpoints: path -> the OperatorActionKind it runs."""
    found = {}
    for pattern in urls.urlpatterns:
        view = getattr(pattern.callback, "view_class", None)
        if view is not None and issubclass(view, OperatorActionApi):
            found[str(pattern.pattern)] = view.action
    return found


def test_every_admin_operator_action_is_an_api_endpoint_running_the_same_service():
    in_admin = admin_operator_actions()
    in_api = api_operator_actions()
    assert in_admin, "the admin registry has operator actions"
    missing = {label: kind for label, kind in in_admin.items() if kind not in in_api.values()}
    assert not missing, f"offered by the admin but not by the API: {missing}"
    assert set(in_api.values()) == set(in_admin.values()) == set(OPERATOR_ACTIONS)
    # One endpoint per action: two paths for one kind would be two ways to document.
    assert len(in_api) == len(set(in_api.values()))


def _imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


@pytest.mark.parametrize("app", LOWER_APPS)
def test_no_app_below_the_console_imports_it(app):
    offenders = sorted(
        f"{path.relative_to(ROOT)} imports {module}"
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.parts
        for module in _imported_modules(path)
        if module == "console" or module.startswith("console.")
    )
    assert not offenders


@pytest.mark.django_db
def test_the_delivery_page_shows_no_updated_at(admin_client, client, admin_user):
    row = samples.delivery(client, admin_user)
    page = admin_client.get(reverse("admin:ingress_delivery_change", args=[row.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "field-finished_at" in html
    assert "field-updated_at" not in html


@pytest.mark.django_db
def test_the_search_help_names_what_it_matches_and_event_types_link_to_a_filter(
    admin_client, client, push_handler
):
    push = receive_github(client, delivery="push-1", event="push")
    issue = receive_github(client, delivery="issue-1", event="issues")
    inbox_run_once()
    changelist = reverse("admin:ingress_rawevent_changelist")
    response = admin_client.get(changelist)
    help_text = response.context["cl"].search_help_text
    # Matching event types in the search would scan the whole store: the help no longer
    # promises it, and says where event types are found instead.
    assert help_text.startswith("Event id, delivery id or dedup key (exact)")
    assert "Click an event type" in help_text
    link = f'<a href="{changelist}?event_type=issues">issues</a>'
    assert link in response.content.decode()
    listed = admin_client.get(changelist, {"event_type": "issues"}).context["cl"].result_list
    assert [event.pk for event in listed] == [issue.pk]
    assert push.pk not in [event.pk for event in listed]
