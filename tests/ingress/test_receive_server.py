"""The production web server's configuration (eventdrop/web.py) and its start-up checks."""

import pytest
from django.core import checks

from eventdrop.web import WebServerConfig
from ingress.sources import all_sources, reset_sources_cache
from kernel.budgets import webhook_budget_seconds, webhook_receive_worst_case


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
        {
            "PORT": "5001",
            "WEB_CONCURRENCY": "3",
            "WEB_STORE_CONNECTIONS": "2",
            "WEB_HEADER_READ_TIMEOUT_SECONDS": "2.5",
            "WEB_MAX_HEADER_BYTES": "100",
        }
    )
    assert (config.port, config.processes, config.store_connections) == (5001, 3, 2)
    assert config.header_read_timeout_seconds == 2.5
    assert config.max_header_bytes == 8192  # never below what every provider's head fits in


def test_defaults_fit_the_webhook_budget(environ):
    assert server_messages() == []


def test_each_sources_budget_is_its_senders_timeout_within_the_routes():
    sources = all_sources()
    assert {name: source.timeout_seconds for name, source in sources.items()} == {
        "stripe": None,
        "github": 10,
        "slack": 3,
        "renderer": 15,
    }
    assert webhook_budget_seconds(sources["slack"].timeout_seconds) == 3.0
    assert webhook_budget_seconds(sources["stripe"].timeout_seconds) == 30.0  # publishes none
    assert webhook_budget_seconds(45) == 30.0  # never past WEBHOOK_REQUEST_BUDGET_SECONDS


def test_the_receive_worst_case_is_the_header_then_one_deadline_for_the_rest():
    worst = webhook_receive_worst_case(budget=3.0, header=1.0)

    assert worst.seconds == 3.0
    assert worst.arithmetic == (
        "header 1.0 s (WEB_HEADER_READ_TIMEOUT_SECONDS) + min(body read 5.0 s "
        "(WEBHOOK_BODY_READ_TIMEOUT_SECONDS) + queue wait and store 5.0 s "
        "(WEBHOOK_STORE_TIMEOUT_SECONDS), the 2.0 s the budget leaves) = 3.0 s"
    )
    assert webhook_receive_worst_case(budget=30.0, header=1.0).seconds == 11.0


def test_a_header_read_that_leaves_a_source_nothing_fails_the_check_for_that_source(environ):
    environ.setenv("WEB_HEADER_READ_TIMEOUT_SECONDS", "3")

    (message,) = server_messages()

    assert (message.id, message.level) == ("ingress.E003", checks.ERROR)
    assert message.msg.startswith("Webhook source 'slack': receive worst case header 3.0 s")
    assert "against its 3.0 s budget (its timeout_seconds, its sender's timeout)" in message.msg


def test_header_read_timeout_counts_against_every_sources_budget(environ):
    environ.setenv("WEB_HEADER_READ_TIMEOUT_SECONDS", "25")

    messages = server_messages()

    assert {m.id for m in messages} == {"ingress.E003"}
    assert sorted(m.msg.split("'")[1] for m in messages) == ["github", "renderer", "slack"]


def test_a_sources_own_timeout_overrides_its_providers(environ):
    environ.setenv("WEBHOOK_GITHUB_TIMEOUT_SECONDS", "1")
    reset_sources_cache()

    (message,) = server_messages()

    assert "'github'" in message.msg and "against its 1.0 s budget" in message.msg
    environ.setenv("WEBHOOK_GITHUB_TIMEOUT_SECONDS", "2")
    reset_sources_cache()
    assert server_messages() == []


def test_the_routes_budget_caps_every_source(environ, settings):
    settings.WEBHOOK_REQUEST_BUDGET_SECONDS = 1.0

    messages = server_messages()

    assert sorted(m.msg.split("'")[1] for m in messages) == [
        "github",
        "renderer",
        "slack",
        "stripe",
    ]
    assert all("(WEBHOOK_REQUEST_BUDGET_SECONDS)" in m.msg for m in messages)


def test_body_bytes_in_flight_below_a_sources_largest_body_fails_the_check(environ):
    environ.setenv("WEB_MAX_BODY_BYTES_IN_FLIGHT", str(512 * 1024))

    messages = server_messages()

    assert [m.id for m in messages] == ["ingress.E003"] * 4
    assert "WEB_MAX_BODY_BYTES_IN_FLIGHT" in messages[0].msg


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WEB_CONCURRENCY", "many"),
        ("WEB_CONCURRENCY", "0"),
        ("WEB_HEADER_READ_TIMEOUT_SECONDS", "61"),
        ("WEB_STORE_CONNECTIONS", "0"),
        ("WEB_MAX_CONNECTIONS", "100"),
    ],
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


def test_connections_webhooks_and_body_bytes_per_process_are_capped_explicitly():
    # Caps somebody chose: docs/architecture.md ("Memory") bounds a process by them, and
    # tests/faults/test_slow_clients.py measures it.
    config = WebServerConfig.from_environ({})
    assert (config.max_connections, config.max_concurrent_requests) == (512, 256)
    assert config.max_body_bytes_in_flight == 16 * 1024 * 1024
    config = WebServerConfig.from_environ(
        {"WEB_MAX_CONNECTIONS": "64", "WEB_MAX_CONCURRENT_REQUESTS": "16"}
    )
    assert (config.max_connections, config.max_concurrent_requests) == (64, 16)
    for variables in (
        {"WEB_MAX_CONCURRENT_REQUESTS": "0"},
        {"WEB_MAX_CONNECTIONS": "256"},
        {"WEB_MAX_BODY_BYTES_IN_FLIGHT": "-1"},
    ):
        with pytest.raises(ValueError, match="WEB_MAX_"):
            WebServerConfig.from_environ(variables)
