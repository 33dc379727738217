"""Every admin this project registers renders, and every action it declares is reachable.

dj-stripe once shipped a `reprocess` admin action that was written but never registered;
these tests walk the live admin registry so that cannot happen here.
"""

import inspect

import pytest
from django.contrib import admin
from django.contrib.admin import helpers
from django.test import RequestFactory
from django.urls import reverse

from console.models import OperatorAction
from tests.console.samples import SAMPLES

pytestmark = pytest.mark.django_db

PROJECT_APPS = {"eventdrop", "kernel", "ingress", "recaps", "outbox", "console"}

# Content staff curate by hand (the events and photos recaps are cut from): editable in the
# admin. Every other model is pipeline state, written by services only.
CONTENT_MODELS = {"recaps.event", "recaps.photo"}

PROJECT_ADMINS = sorted(
    (
        (model, model_admin)
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label in PROJECT_APPS
    ),
    key=lambda pair: pair[0]._meta.label_lower,
)


def _declared_action_names(model_admin) -> list[str]:
    names = []
    for action in model_admin.actions or ():
        names.append(action if isinstance(action, str) else action.__name__)
    return names


def _action_shaped_methods(model_admin) -> set[str]:
    """Methods that look like admin actions: decorated as one, or (request, queryset)."""
    found = set()
    for name, member in inspect.getmembers(type(model_admin), inspect.isfunction):
        if name.startswith("_") or hasattr(admin.ModelAdmin, name):
            continue
        params = list(inspect.signature(member).parameters)
        if hasattr(member, "allowed_permissions") or params[1:3] == ["request", "queryset"]:
            found.add(name)
    return found


ACTIONS = [
    pytest.param(model, model_admin, name, id=f"{model._meta.label_lower}.{name}")
    for model, model_admin in PROJECT_ADMINS
    for name in _declared_action_names(model_admin)
]


def test_the_console_admins_are_registered():
    labels = {model._meta.label_lower for model, _ in PROJECT_ADMINS}
    assert {"ingress.rawevent", "ingress.delivery", "console.operatoraction"} <= labels


@pytest.mark.parametrize(
    ("model", "model_admin"),
    [pytest.param(m, a, id=m._meta.label_lower) for m, a in PROJECT_ADMINS],
)
def test_every_action_shaped_method_is_declared(model, model_admin):
    undeclared = _action_shaped_methods(model_admin) - set(_declared_action_names(model_admin))
    assert not undeclared, f"{type(model_admin).__name__} has actions nobody can reach"


@pytest.mark.parametrize(
    ("model", "model_admin"),
    [pytest.param(m, a, id=m._meta.label_lower) for m, a in PROJECT_ADMINS],
)
def test_every_admin_has_a_sample_and_renders(model, model_admin, admin_client, admin_user, client):
    assert model._meta.label_lower in SAMPLES, "add a sample row to tests/console/samples.py"
    obj = SAMPLES[model._meta.label_lower](client, admin_user)
    info = (model._meta.app_label, model._meta.model_name)
    changelist = admin_client.get(reverse("admin:{}_{}_changelist".format(*info)))
    assert changelist.status_code == 200
    detail = admin_client.get(reverse("admin:{}_{}_change".format(*info), args=[obj.pk]))
    assert detail.status_code == 200
    if model._meta.label_lower in CONTENT_MODELS:
        assert admin_client.get(reverse("admin:{}_{}_add".format(*info))).status_code == 200
        return
    # Rows are written by services only.
    assert admin_client.get(reverse("admin:{}_{}_add".format(*info))).status_code == 403
    assert not model_admin.has_delete_permission(detail.wsgi_request, obj)


@pytest.mark.parametrize(("model", "model_admin", "name"), ACTIONS)
def test_every_declared_action_resolves_and_runs(
    model, model_admin, name, admin_client, admin_user, client
):
    request = RequestFactory().get("/")
    request.user = admin_user
    assert model_admin.get_action(name) is not None, f"{name} does not resolve"
    assert name in model_admin.get_actions(request), f"{name} is not offered to a superuser"

    obj = SAMPLES[model._meta.label_lower](client, admin_user)
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
    selection = {"action": name, helpers.ACTION_CHECKBOX_NAME: [str(obj.pk)]}

    if "operate" not in getattr(model_admin.get_action(name)[0], "allowed_permissions", ()):
        # Not an operator action (a staff member's own recap of a curated event, say): it
        # runs at once and reports, and is not part of the operator audit trail.
        assert admin_client.post(url, {**selection, "index": "0"}).status_code in (200, 302)
        return

    confirm = admin_client.post(url, {**selection, "index": "0"})
    assert confirm.status_code == 200
    assert confirm.templates[0].name == "console/admin/confirm_action.html"
    assert "This will touch 1 " in confirm.content.decode()

    recorded = OperatorAction.objects.count()
    done = admin_client.post(url, {**selection, "post": "yes", "note": "walk test"})
    assert done.status_code == 302
    assert OperatorAction.objects.count() == recorded + 1
    record = OperatorAction.objects.latest("id")
    assert record.target_ids == [obj.pk if isinstance(obj.pk, int) else str(obj.pk)]
    assert record.actor == admin_user
    assert record.outcome != "running"
