"""The production web server's configuration (eventdrop/web.py) and its start-up checks."""

import pytest
from django.core import checks

from eventdrop.web import WebServerConfig
from ingress.sources import reset_sources_cache


def server_messages() -> list[checks.CheckMessage]:
    # Through the registry, so the test also proves the check is registered.
    return [m for m in checks.run_checks() if m.id in ("ingress.E003", "ingress.W002")]


@pytest.fixture
def environ(monkeypatch):
    reset_sources_cache()
    yield monkeypatch
    monkeypatch.undo()
    reset_sources_cache()


def test_binds_loopback_unless_told_otherwise():
    assert WebServerConfig.from_environ({}).host == "127.0.0.1"
    assert WebServerConfig.from_environ({"HOST": "10.0.0.5"}).host == "10.0.0.5"
    assert WebServerConfig.from_environ({"WEB_BIND": "0.0.0.0", "HOST": "x"}).host == "0.0.0.0"  # noqa: S104


def test_port_processes_threads_and_header_bounds_come_from_the_environment():
    config = WebServerConfig.from_environ(
        {"PORT": "5001", "WEB_CONCURRENCY": "3", "WEB_THREADS": "8",
         "WEB_HEADER_READ_TIMEOUT_SECONDS": "2.5", "WEB_MAX_HEADER_BYTES": "100"}
    )
    assert (config.port, config.processes, config.threads) == (5001, 3, 8)
    assert config.header_read_timeout_seconds == 2.5
    assert config.max_header_bytes == 8192  # granian's smallest read buffer


def test_defaults_fit_the_webhook_budget(environ):
    assert server_messages() == []


def test_body_read_deadline_past_the_budget_fails_the_check(environ, settings):
    settings.WEBHOOK_BODY_READ_TIMEOUT_SECONDS = 28.0

    messages = server_messages()

    assert [(m.id, m.level) for m in messages] == [("ingress.E003", checks.ERROR)]
    assert "body 28.0 s (WEBHOOK_BODY_READ_TIMEOUT_SECONDS)" in messages[0].msg
    assert "exceeds the 30.0 s budget" in messages[0].msg


def test_header_read_timeout_counts_against_the_budget(environ):
    environ.setenv("WEB_HEADER_READ_TIMEOUT_SECONDS", "25")

    messages = server_messages()

    assert [m.id for m in messages] == ["ingress.E003"]
    assert "headers 25.0 s" in messages[0].msg


@pytest.mark.parametrize(
    ("variable", "value"),
    [("WEB_THREADS", "many"), ("WEB_THREADS", "0"), ("WEB_HEADER_READ_TIMEOUT_SECONDS", "61")],
)
def test_malformed_server_setting_fails_the_check(environ, variable, value):
    environ.setenv(variable, value)

    assert [m.id for m in server_messages()] == ["ingress.E003"]


def test_source_header_limit_above_the_servers_is_warned_about(environ):
    environ.setenv("WEBHOOK_STRIPE_MAX_HEADER_BYTES", str(128 * 1024))
    reset_sources_cache()

    messages = server_messages()

    assert [(m.id, m.level) for m in messages] == [("ingress.W002", checks.WARNING)]
    assert "'stripe'" in messages[0].msg and "65536" in messages[0].msg


def test_concurrent_requests_per_process_are_capped_explicitly():
    # granian's own default (512 per process, each buffering up to the body limit) is not
    # a memory bound anyone chose.
    assert WebServerConfig.from_environ({}).max_concurrent_requests == 64
    assert WebServerConfig.from_environ(
        {"WEB_MAX_CONCURRENT_REQUESTS": "16"}
    ).max_concurrent_requests == 16
    with pytest.raises(ValueError, match="WEB_MAX_CONCURRENT_REQUESTS"):
        WebServerConfig.from_environ({"WEB_THREADS": "8", "WEB_MAX_CONCURRENT_REQUESTS": "4"})


def _call(handler, path: str, **extra) -> tuple[int, dict[str, str]]:
    from django.test import RequestFactory

    environ = RequestFactory().generic(
        "POST", path, b'{"id": "evt_lean"}', content_type="application/json", **extra
    ).environ
    answer: dict = {}

    def start_response(status, headers, exc_info=None):
        answer["status"] = int(status.split()[0])
        answer["headers"] = dict(headers)

    b"".join(handler(environ, start_response))
    return answer["status"], answer["headers"]


@pytest.mark.django_db(transaction=True)
def test_webhooks_run_behind_only_the_middleware_they_need():
    from django.core.handlers.wsgi import WSGIHandler

    from eventdrop.web import webhook_handler
    from ingress.models import RawEvent

    signed = {"HTTP_STRIPE_SIGNATURE": "t=1,v1=00"}
    status, headers = _call(webhook_handler(), "/webhooks/stripe/", **signed)
    assert status == 202
    assert bytes(RawEvent.objects.get().body) == b'{"id": "evt_lean"}'
    # Security headers stay; the clickjacking header (a page's) and the session do not.
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "X-Frame-Options" not in headers
    assert "X-Frame-Options" in _call(WSGIHandler(), "/webhooks/stripe/", **signed)[1]
    # The Host check (CommonMiddleware) still answers 400 before anything is stored.
    assert _call(webhook_handler(), "/webhooks/stripe/", HTTP_HOST="evil.example", **signed)[
        0
    ] == 400
    assert RawEvent.objects.count() == 2
