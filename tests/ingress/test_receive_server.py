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


def test_port_processes_and_header_bounds_come_from_the_environment():
    config = WebServerConfig.from_environ(
        {"PORT": "5001", "WEB_CONCURRENCY": "3", "WEB_STORE_CONNECTIONS": "2",
         "WEB_HEADER_READ_TIMEOUT_SECONDS": "2.5", "WEB_MAX_HEADER_BYTES": "100"}
    )
    assert (config.port, config.processes, config.store_connections) == (5001, 3, 2)
    assert config.header_read_timeout_seconds == 2.5
    assert config.max_header_bytes == 8192  # never below what every provider's head fits in


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
    [("WEB_CONCURRENCY", "many"), ("WEB_CONCURRENCY", "0"),
     ("WEB_HEADER_READ_TIMEOUT_SECONDS", "61"), ("WEB_STORE_CONNECTIONS", "0")],
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
    # A cap somebody chose: what a process holds for requests is at most this many times the
    # head and body limits (tests/ingress/test_receive_framing.py drives it on the server).
    assert WebServerConfig.from_environ({}).max_concurrent_requests == 64
    assert WebServerConfig.from_environ(
        {"WEB_MAX_CONCURRENT_REQUESTS": "16"}
    ).max_concurrent_requests == 16
    with pytest.raises(ValueError, match="WEB_MAX_CONCURRENT_REQUESTS"):
        WebServerConfig.from_environ({"WEB_MAX_CONCURRENT_REQUESTS": "0"})
