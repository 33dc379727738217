"""`manage.py console_user`: staff users by role, each role a group of exactly its
permissions; what each role may then do in the console."""

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = pytest.mark.django_db


def make(*args: str) -> str:
    out = StringIO()
    call_command("console_user", *args, stdout=out)
    return out.getvalue()


def test_each_role_may_what_it_says(client, monkeypatch):
    assert "made ada: staff, viewer" in make("ada", "--role", "viewer")
    ada = get_user_model().objects.get(username="ada")
    assert ada.is_staff and not ada.has_usable_password()
    assert ada.has_perm("ingress.view_rawevent") and ada.has_perm("console.view_ops")
    assert not ada.has_perm("console.operate") and not ada.has_perm("ingress.view_raw_payload")
    client.force_login(ada)
    assert client.get("/admin/ingress/rawevent/").status_code == 200
    assert client.get("/ops/").status_code == 200
    assert client.get("/ops/jobs/new/").status_code == 403

    monkeypatch.setenv("ADA_PASSWORD", "a long enough password")
    assert "changed ada: staff, operator" in make(
        "ada", "--role", "operator", "--password-env", "ADA_PASSWORD"
    )
    ada = get_user_model().objects.get(username="ada")
    assert ada.check_password("a long enough password")
    assert ada.has_perm("console.operate") and not ada.has_perm("ingress.view_raw_payload")
    assert [group.name for group in ada.groups.all()] == ["console operators"]

    make("ada", "--role", "payload-reader")
    ada = get_user_model().objects.get(username="ada")
    assert ada.has_perm("ingress.view_raw_payload") and ada.has_perm("console.operate")
    assert [group.name for group in ada.groups.all()] == ["console payload readers"]


def test_a_missing_password_variable_is_refused(monkeypatch):
    monkeypatch.delenv("NOPE", raising=False)
    with pytest.raises(CommandError, match="NOPE is not set"):
        make("bob", "--role", "viewer", "--password-env", "NOPE")
    assert not get_user_model().objects.filter(username="bob").exists()
