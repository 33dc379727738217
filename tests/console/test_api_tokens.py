"""`manage.py api_token`: tokens for scripts, shown once, stored only hashed, revocable."""

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from knox.models import AuthToken
from rest_framework.test import APIClient

from tests.console.conftest import OPERATOR_PERMISSIONS, grant

pytestmark = pytest.mark.django_db


def issue(username: str, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("api_token", "issue", username, *args, stdout=out, stderr=err)
    assert "not shown again" in err.getvalue()
    return out.getvalue().strip()


@pytest.fixture
def bot(django_user_model):
    user = django_user_model.objects.create_user("oncall-bot", is_staff=True)
    return grant(user, *OPERATOR_PERMISSIONS)


def test_issue_use_and_revoke(bot):
    token = issue("oncall-bot", "--ttl-days", "7")
    api = APIClient()
    response = api.get("/api/raw-events/", HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 200
    record = AuthToken.objects.get()
    assert abs((record.expiry - record.created) - timedelta(days=7)) < timedelta(minutes=1)

    listing = io.StringIO()
    call_command("api_token", "list", stdout=listing)
    assert record.token_key in listing.getvalue() and token not in listing.getvalue()

    out = io.StringIO()
    call_command("api_token", "revoke", "oncall-bot", "--key", token[:15], stdout=out)
    assert "revoked 1 token(s)" in out.getvalue()
    response = api.get("/api/raw-events/", HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 401


def test_the_token_is_stored_only_as_a_digest(bot):
    token = issue("oncall-bot")
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM knox_authtoken")
        stored = " ".join(str(value) for row in cursor.fetchall() for value in row)
    assert token not in stored
    # The key (first 15 characters) is kept to find the row, the rest only hashed.
    assert token[:15] in stored and token[15:] not in stored


def test_revoking_all_tokens_of_a_user(bot):
    tokens = [issue("oncall-bot") for _ in range(2)]
    call_command("api_token", "revoke", "oncall-bot", stdout=io.StringIO())
    for token in tokens:
        response = APIClient().get("/api/raw-events/", HTTP_AUTHORIZATION=f"Token {token}")
        assert response.status_code == 401


@pytest.mark.parametrize(
    ("username", "args", "message"),
    [
        ("nobody", (), "No user 'nobody'."),
        ("buyer", (), "buyer is not staff"),
        ("oncall-bot", ("--ttl-days", "0"), "at least one day"),
    ],
)
def test_issue_refusals(bot, django_user_model, username, args, message):
    django_user_model.objects.create_user("buyer")
    with pytest.raises(CommandError, match=message):
        call_command("api_token", "issue", username, *args, stdout=io.StringIO())
    assert not AuthToken.objects.exists()


def test_the_admin_lists_tokens_but_cannot_issue_or_show_them(admin_client, bot):
    token = issue("oncall-bot")
    record = AuthToken.objects.get()
    listing = admin_client.get("/admin/knox/authtoken/")
    assert listing.status_code == 200
    page = listing.content.decode()
    assert record.token_key in page and "oncall-bot" in page
    # The digest is the row's key (it is in the URL): a hash, useless to authenticate with.
    assert token not in page and token[15:] not in page
    assert admin_client.get("/admin/knox/authtoken/add/").status_code == 403
    detail = admin_client.get(f"/admin/knox/authtoken/{record.pk}/change/")
    assert detail.status_code == 200 and token[15:] not in detail.content.decode()
