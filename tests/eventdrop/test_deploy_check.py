"""`manage.py check --deploy` is clean under production settings, and the headers it asks
for are really sent.

The check runs in a subprocess with a production environment (DJANGO_DEBUG off, a real
secret key, every secret and URL a deployment has), as a release step would run it, with
`--fail-level WARNING`: a new deploy-check warning fails CI. About 3 s per subprocess.
"""

import os
import subprocess

import pytest

from tests.support.processes import PYTHON, ROOT, app_env

pytestmark = pytest.mark.slow

PRODUCTION = {
    "DJANGO_SECRET_KEY": "prod-like-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz-ABCDEF",
    "ALLOWED_HOSTS": "eventdrop.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://eventdrop.example.com",
    "STRIPE_API_KEY": "sk_test_deploycheck",
    "RENDER_SERVICE_URL": "https://render.internal.example.com",
    "RENDER_CALLBACK_URL": "https://eventdrop.example.com/webhooks/renderer/",
}


def deploy_check(**overrides: str) -> subprocess.CompletedProcess:
    database_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/eventdrop")
    env = app_env(database_url, **{**PRODUCTION, **overrides})
    return subprocess.run(
        [PYTHON, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_deploy_is_clean_in_production():
    result = deploy_check()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("overrides", "check_id"),
    [
        ({"SECURE_HSTS_SECONDS": "0"}, "security.W004"),
        # Long enough for the settings (50), too few distinct characters for Django.
        ({"DJANGO_SECRET_KEY": "ab" * 25}, "security.W009"),
    ],
    ids=["no-hsts", "weak-secret-key"],
)
def test_the_check_fails_a_weaker_configuration(overrides, check_id):
    # The clean result above means something: weaken one setting and the same command fails.
    result = deploy_check(**overrides)
    assert result.returncode != 0
    assert check_id in result.stdout + result.stderr


@pytest.mark.parametrize(
    "overrides",
    [
        {"SECURE_SSL_REDIRECT": "1"},
        {"SECURE_HSTS_INCLUDE_SUBDOMAINS": "1", "SECURE_HSTS_PRELOAD": "1"},
    ],
    ids=["app-redirects", "domain-wide-hsts"],
)
def test_the_opt_ins_are_clean_too(overrides):
    result = deploy_check(**overrides)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.django_db
def test_the_headers_behind_the_proxy(client, settings):
    # What the browser gets through the TLS-terminating proxy (X-Forwarded-Proto: https).
    response = client.get("/admin/login/", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 200
    assert response["Strict-Transport-Security"] == "max-age=31536000"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"
    # Plain HTTP (an internal caller) is served, not redirected, and gets no HSTS.
    plain = client.get("/admin/login/")
    assert plain.status_code == 200 and "Strict-Transport-Security" not in plain
