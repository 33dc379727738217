"""Budgets as code: the worst cases are computed, and `manage.py check` refuses a misfit."""

import math

import pytest
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from kernel.budgets import (
    Caller,
    WorstCase,
    database_statement_worst_case,
    render_dispatch_worst_case,
    stripe_call_worst_case,
)
from outbox import checks
from outbox.checks import check_time_budgets, side_effect_give_up, time_budget_violations
from outbox.render_client import RenderClientConfig

SEED_WEBHOOK_CALLER = Caller(
    "stripe webhook awaiting the render (the seed's triggerRecapRender)",
    "WEBHOOK_REQUEST_BUDGET_SECONDS",
    "render.dispatch",
)


@pytest.fixture
def seed_numbers(settings):
    """The seed's render client: 5 s health, 4 attempts of 10 s, backoff 2/4/8 s."""
    settings.RENDER_HEALTH_TIMEOUT_SECONDS = 5.0
    settings.RENDER_TIMEOUT_SECONDS = 10.0
    settings.RENDER_CALL_ATTEMPTS = 4
    settings.RENDER_CALL_BACKOFF_BASE_SECONDS = 2.0
    settings.RENDER_CALL_BACKOFF_CAP_SECONDS = 8.0


@pytest.fixture
def seed_wiring(monkeypatch):
    """The seed's wiring: the Stripe webhook awaited the render inside its 30 s budget."""
    monkeypatch.setattr(checks, "CALLERS", [*checks.CALLERS, SEED_WEBHOOK_CALLER])


def test_default_render_dispatch_worst_case():
    worst = render_dispatch_worst_case(RenderClientConfig.from_settings())
    assert worst.seconds == 13.0
    assert worst.arithmetic == "health 3.0 s + 1 x render 10.0 s = 13.0 s"


def test_seed_render_worst_case_arithmetic(seed_numbers):
    worst = render_dispatch_worst_case(RenderClientConfig.from_settings())
    assert worst.seconds == 59.0
    assert worst.arithmetic == "health 5.0 s + 4 x render 10.0 s + backoff 2.0+4.0+8.0 s = 59.0 s"


def test_default_stripe_worst_case_counts_timeouts_retries_and_sdk_sleep():
    worst = stripe_call_worst_case()
    assert worst.seconds == 12.5
    assert worst.arithmetic == ("2 x (connect 2.0 s + read 4.0 s) + SDK retry sleep 0.5 s = 12.5 s")


def test_check_passes_on_the_defaults():
    assert check_time_budgets() == []
    call_command("check")  # raises SystemCheckError on any Error


def test_check_fails_on_the_seeds_numbers_against_the_webhook_budget(seed_numbers, seed_wiring):
    messages = check_time_budgets()
    assert all(isinstance(m, Error) and m.id == "outbox.E001" for m in messages)
    texts = [m.msg for m in messages]
    assert (
        "render.dispatch worst case health 5.0 s + 4 x render 10.0 s + backoff 2.0+4.0+8.0 s "
        "= 59.0 s exceeds the 30.0 s budget of the stripe webhook awaiting the render (the "
        "seed's triggerRecapRender) (WEBHOOK_REQUEST_BUDGET_SECONDS)."
    ) in texts
    with pytest.raises(SystemCheckError, match=r"59\.0 s exceeds the 30\.0 s budget"):
        call_command("check")


def test_the_seeds_numbers_barely_fit_one_dispatch_per_dispatcher_run(seed_numbers, settings):
    # Moved to the outbox, 59 s of worst case fits a 60 s run exactly once (the seed's
    # "one recap per run"); a shorter run budget is refused outright.
    assert time_budget_violations() == []
    settings.OUTBOX_DISPATCH_BUDGET_SECONDS = 50.0
    (violation,) = time_budget_violations()
    assert violation.caller.budget_setting == "OUTBOX_DISPATCH_BUDGET_SECONDS"
    assert "59.0 s exceeds the 50.0 s budget of the outbox dispatcher run" in violation.message


def test_stripe_sdk_timeouts_and_retries_are_checked_against_the_purchase_budget(settings):
    settings.STRIPE_READ_TIMEOUT_SECONDS = 10.0
    settings.STRIPE_MAX_NETWORK_RETRIES = 2
    (violation,) = time_budget_violations()
    assert violation.message == (
        "stripe.checkout_session worst case 3 x (connect 2.0 s + read 10.0 s) + SDK retry "
        "sleep 0.5+1.0 s = 37.5 s exceeds the 15.0 s budget of the recap purchase request "
        "(RECAP_PURCHASE_BUDGET_SECONDS)."
    )


@pytest.mark.parametrize(
    ("database", "seconds", "arithmetic"),
    [
        (
            {
                "ENGINE": "django.db.backends.postgresql",
                "OPTIONS": {"connect_timeout": 3, "options": "-c statement_timeout=15000"},
            },
            18.0,
            "connect 3.0 s + statement 15.0 s = 18.0 s",
        ),
        (
            {"ENGINE": "django.db.backends.postgresql", "OPTIONS": {"connect_timeout": 3}},
            math.inf,
            "no connect_timeout or statement_timeout: unbounded",
        ),
    ],
)
def test_database_statement_worst_case(database, seconds, arithmetic):
    worst = database_statement_worst_case(database)
    assert (worst.seconds, worst.arithmetic) == (seconds, arithmetic)


def test_the_webhook_receive_path_is_held_to_its_budget(monkeypatch, settings):
    slow = WorstCase(48.0, "connect 3.0 s + statement 45.0 s = 48.0 s")
    monkeypatch.setitem(checks.OPERATIONS, "ingress.raw_event_store", lambda: slow)
    (violation,) = time_budget_violations()
    assert violation.message == (
        "ingress.raw_event_store worst case connect 3.0 s + statement 45.0 s = 48.0 s exceeds the "
        "30.0 s budget of the webhook receive request (WEBHOOK_REQUEST_BUDGET_SECONDS)."
    )


def test_dispatcher_budget_must_fit_inside_the_task_timeout_and_the_stale_threshold(settings):
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "timeout": 60}
    settings.OUTBOX_STALE_PROCESSING_SECONDS = 60
    assert {m.id for m in check_time_budgets()} == {"outbox.E002", "outbox.E003"}


def test_the_give_up_arithmetic_reports_the_horizon_next_to_the_attempts():
    give_up = side_effect_give_up()
    assert (give_up.attempts, give_up.backoff_seconds, give_up.min_life_seconds) == (
        5,
        900.0,
        86400.0,
    )
    assert give_up.arithmetic.startswith(
        "dead after 5 charged attempts (OUTBOX_MAX_ATTEMPTS) with pauses of at most "
        "60.0+120.0+240.0+480.0 s = 900.0 s between them, the last attempt no earlier than "
        "the horizon, 86400.0 s (24.0 h, OUTBOX_TRANSIENT_HORIZON_SECONDS) after the first "
        "charged failure: a transient failure keeps a row alive for at least 86400.0 s"
    )


def test_check_warns_about_a_horizon_shorter_than_the_backoff_and_fails_a_negative_one(settings):
    from outbox.checks import check_side_effect_give_up

    assert check_side_effect_give_up() == []
    settings.OUTBOX_TRANSIENT_HORIZON_SECONDS = 600
    (warning,) = check_side_effect_give_up()
    assert warning.id == "outbox.W002" and "900.0 s between them" in warning.msg
    settings.OUTBOX_TRANSIENT_HORIZON_SECONDS = -1
    (error,) = check_side_effect_give_up()
    assert error.id == "outbox.E006" and "invalid retry horizon" in error.msg
