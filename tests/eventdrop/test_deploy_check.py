"""`manage.py check --deploy` is clean under production settings, and the headers it asks
for are really sent; a first release with only the web process's settings migrates, and
`check --deploy` then names what the other processes still need.

The check runs in a subprocess with a production environment (DJANGO_DEBUG off, a real
secret key, every secret and URL a deployment has), as a release step would run it, with
`--fail-level WARNING`: a new deploy-check warning fails CI. About 3 s per subprocess.
"""

import subprocess
from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from tests.support.processes import (
    PYTHON,
    ROOT,
    app_env,
    procfile_command,
    settings_database_url,
)

pytestmark = pytest.mark.slow

PRODUCTION = {
    "DJANGO_SECRET_KEY": "prod-like-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz-ABCDEF",
    "ALLOWED_HOSTS": "eventdrop.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://eventdrop.example.com",
    "STRIPE_API_KEY": "sk_test_deploycheck",
    "RENDER_SERVICE_URL": "https://render.internal.example.com",
    "RENDER_CALLBACK_URL": "https://eventdrop.example.com/webhooks/renderer/",
}


# What only the other processes need (kernel/process_kinds.py): the web process stores
# webhooks and calls nothing out.
OUTBOUND = ("RENDER_SERVICE_URL", "RENDER_CALLBACK_URL", "STRIPE_API_KEY")


def run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def deploy_check(**overrides: str) -> subprocess.CompletedProcess:
    env = app_env(settings_database_url(), **{**PRODUCTION, **overrides})
    return run([PYTHON, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], env)


def web_only_env(url: str, **extra: str) -> dict[str, str]:
    """Production as the web process has it: DJANGO_DEBUG unset, no outbound configuration."""
    env = app_env(url, **{k: v for k, v in PRODUCTION.items() if k not in OUTBOUND}, **extra)
    for name in ("DJANGO_DEBUG", *OUTBOUND):
        env.pop(name, None)
    return env


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


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """An empty database of this run's own, as a first release finds it; dropped after."""
    db = settings.DATABASES["default"]
    name = f"{db['NAME']}_first_release"
    server = {
        "host": db["HOST"] or "127.0.0.1",
        "port": db["PORT"] or 5432,
        "user": db["USER"],
        "password": db["PASSWORD"] or None,
        "dbname": "postgres",
        "autocommit": True,
    }
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(**server) as conn:
        conn.execute(drop)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(**server) as conn:
            conn.execute(drop)


def test_a_first_release_with_only_the_web_settings(fresh_database):
    env = web_only_env(settings_database_url(fresh_database))
    # A plain `migrate`, as an operator types it (no EVENTDROP_PROCESS).
    migrate = run([PYTHON, "manage.py", "migrate", "--noinput"], env)
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    # The Procfile's release line as a platform runs it: through a shell, every step.
    release = run(["bash", "-c", procfile_command("release")], env)
    assert release.returncode == 0, release.stdout + release.stderr
    for result in (migrate, release):
        # Nothing about the render service or Stripe, not even a warning.
        assert "outbox.E004" not in result.stderr and "recaps.W001" not in result.stderr
    with psycopg.connect(settings_database_url(fresh_database)) as conn:
        assert conn.execute("SELECT to_regclass('ingress_rawevent')::text").fetchone() == (
            "ingress_rawevent",
        )


@pytest.mark.parametrize("kind", ["", "web", "release"], ids=["no-kind", "web", "release"])
def test_check_deploy_reports_the_missing_outbound_configuration(kind):
    env = web_only_env(settings_database_url(), **({"EVENTDROP_PROCESS": kind} if kind else {}))
    result = run([PYTHON, "manage.py", "check", "--deploy"], env)
    assert result.returncode == 1, result.stdout + result.stderr
    for line in (
        "?: (outbox.E004) RENDER_SERVICE_URL is not set",
        "?: (outbox.E004) RENDER_CALLBACK_URL is not set",
        "?: (recaps.W001) STRIPE_API_KEY is not set",
    ):
        assert result.stderr.count(line) == 1, result.stderr


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
