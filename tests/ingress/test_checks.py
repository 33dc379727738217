"""The webhook source system checks (ingress/checks.py), through Django's check registry."""

import json

import pytest
from django.core import checks

from ingress.sources import all_sources, reset_sources_cache

ACME = {"acme": {"provider": "hmac", "signature_header": "X-Acme-Signature"}}


def ingress_messages() -> list[checks.CheckMessage]:
    # Through the registry, so the test also proves the check is registered.
    return [m for m in checks.run_checks() if m.id and m.id.startswith("ingress.")]


@pytest.fixture
def environ(monkeypatch):
    """monkeypatch for the environment, with the sources cache following every change."""
    reset_sources_cache()
    yield monkeypatch
    monkeypatch.undo()
    reset_sources_cache()


def test_configured_sources_pass(environ):
    assert ingress_messages() == []


def test_source_without_a_secret_is_warned_about(environ):
    environ.delenv("STRIPE_WEBHOOK_SECRET")
    reset_sources_cache()

    messages = ingress_messages()

    assert [(m.id, m.level) for m in messages] == [("ingress.W001", checks.WARNING)]
    assert "'stripe'" in messages[0].msg
    assert "STRIPE_WEBHOOK_SECRET" in (messages[0].hint or "")


def test_extra_source_without_a_secret_names_its_env_var(environ, settings):
    settings.WEBHOOK_EXTRA_SOURCES = json.dumps(ACME)
    environ.delenv("WEBHOOK_ACME_SECRET", raising=False)

    messages = ingress_messages()

    assert [m.id for m in messages] == ["ingress.W001"]
    assert "'acme'" in messages[0].msg and "WEBHOOK_ACME_SECRET" in (messages[0].hint or "")


def test_a_secret_is_never_printed(environ, settings):
    settings.WEBHOOK_EXTRA_SOURCES = json.dumps(ACME)
    environ.setenv("WEBHOOK_ACME_SECRET", "s3cr3t-value-1,s3cr3t-value-2")
    environ.delenv("STRIPE_WEBHOOK_SECRET")
    reset_sources_cache()

    text = " ".join(f"{m.msg} {m.hint}" for m in checks.run_checks())

    assert "s3cr3t-value" not in text and "whsec_" not in text


def test_disabled_source_without_a_secret_is_not_reported(environ):
    environ.delenv("STRIPE_WEBHOOK_SECRET")
    environ.setenv("WEBHOOK_STRIPE_ENABLED", "false")
    reset_sources_cache()

    assert ingress_messages() == []


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ('["acme"]', "JSON object of objects"),
        ('{"acme": "hmac"}', "JSON object of objects"),
        ('{"acme": {"provider": "carrier-pigeon"}}', "provider must be one of"),
        ('{"acme": {"provider": "hmac", "max_body_bytes": "lots"}}', "must be an integer"),
        # true would be read as 1 byte, 1.5 as 1: neither is a size anyone meant.
        ('{"acme": {"provider": "hmac", "max_body_bytes": true}}', "must be an integer"),
        ('{"acme": {"provider": "hmac", "max_body_bytes": 1.5}}', "must be an integer"),
        ('{"gh2": {"provider": "github", "signature_header": "X-Other"}}', "only be set for hmac"),
        # The verifier keys GitHub events by X-GitHub-Delivery and signs Standard Webhooks'
        # webhook-id: a source may not point either elsewhere (ingress/providers.py).
        ('{"gh2": {"provider": "github", "delivery_id_header": "X-Other"}}', "sends x-github"),
        ('{"std": {"provider": "standard", "delivery_id_header": "X-Id"}}', "sends webhook-id"),
    ],
)
def test_invalid_extra_sources_are_an_error(environ, settings, extra, fragment):
    settings.WEBHOOK_EXTRA_SOURCES = extra  # setting_changed resets the sources cache

    messages = ingress_messages()

    assert [(m.id, m.level) for m in messages] == [("ingress.E001", checks.ERROR)]
    assert fragment in messages[0].msg


def test_invalid_option_from_the_environment_is_an_error(environ):
    environ.setenv("WEBHOOK_STRIPE_MAX_BODY_BYTES", "-1")
    reset_sources_cache()

    messages = ingress_messages()

    assert [m.id for m in messages] == ["ingress.E001"]
    assert "'stripe'" in messages[0].msg and "must be positive" in messages[0].msg


def test_reconciliation_budget_that_cannot_fit_one_call_fails_the_check(settings):
    from ingress.checks import check_reconcile_budgets

    assert check_reconcile_budgets() == []
    settings.RECONCILE_RUN_BUDGET_SECONDS = 5
    errors = check_reconcile_budgets()
    assert {error.id for error in errors} == {"ingress.E002"}
    assert any("12.5 s" in error.msg for error in errors)  # the arithmetic is shown


def test_a_provider_that_sends_no_delivery_id_may_record_one(environ, settings):
    environ.setenv("WEBHOOK_STRIPE2_SECRET", "whsec_second")
    settings.WEBHOOK_EXTRA_SOURCES = json.dumps(
        {"stripe2": {"provider": "stripe", "delivery_id_header": "X-Req"}}
    )

    assert ingress_messages() == []
    source = all_sources()["stripe2"]
    assert (source.signature_header, source.delivery_id_header) == ("stripe-signature", "x-req")
