"""Run records, one run at a time, time budgets and the nightly tasks."""

from datetime import timedelta

import pytest
from django.core.management import CommandError
from django.db import IntegrityError, transaction
from django.utils import timezone

from ingress.models import ReconciliationRun
from ingress.reconcile.config import require_tls
from ingress.reconcile.errors import (
    RUN_BUSY,
    ReconcileFailed,
    ReconcileStopped,
)
from ingress.reconcile.selectors import reconciliation_runs_latest
from ingress.reconcile.services import ABANDONED, reconciliation_run_start
from ingress.reconcile.tasks import (
    NO_GITHUB_HOOKS,
    reconcile_github_nightly,
    reconcile_stripe_nightly,
)
from ingress.reconcile.window import Window, iso
from kernel.budgets import (
    BUDGET_USED,
    RECONCILE_BUDGET_OVER_Q_TIMEOUT,
    RECONCILE_BUDGET_UNFIT,
    BudgetClock,
    github_call_worst_case,
    reconcile_budget_problem,
    reconcile_call_worst_case,
)
from kernel.schedules import SCHEDULES
from tests.ingress.reconcile.conftest import STRIPE_TYPE, run

pytestmark = pytest.mark.django_db


def window() -> Window:
    now = timezone.now().replace(microsecond=0)
    return Window(since=now - timedelta(hours=2), until=now - timedelta(minutes=10))


def test_one_run_at_a_time_per_source(stripe_api):
    other = reconciliation_run_start(provider="stripe", source="stripe", scope="", window=window())

    with pytest.raises(CommandError) as busy:
        run("reconcile_stripe")

    assert str(busy.value) == RUN_BUSY.format(
        id=other.id, what="stripe", started=iso(other.started_at)
    )
    assert not stripe_api.list_requests
    # Another GitHub hook is another thing to reconcile, and may run meanwhile.
    reconciliation_run_start(provider="github", source="github", scope="a", window=window())
    reconciliation_run_start(provider="github", source="github", scope="b", window=window())


def test_a_run_left_running_by_a_dead_process_is_marked_abandoned(stripe_api, settings):
    stale = reconciliation_run_start(
        provider="stripe",
        source="stripe",
        scope="",
        window=window(),
        now=timezone.now() - timedelta(seconds=2 * settings.RECONCILE_RUN_BUDGET_SECONDS + 1),
    )

    run("reconcile_stripe")

    stale.refresh_from_db()
    assert (stale.status, stale.error) == ("failed", ABANDONED)
    assert ReconciliationRun.objects.exclude(pk=stale.pk).get().status == "complete"


def test_the_database_holds_the_counts_together():
    record = reconciliation_run_start(provider="stripe", source="stripe", scope="", window=window())
    with pytest.raises(IntegrityError), transaction.atomic():
        ReconciliationRun.objects.filter(pk=record.pk).update(provider_count=5, known_count=4)
    with pytest.raises(IntegrityError), transaction.atomic():
        ReconciliationRun.objects.filter(pk=record.pk).update(status="complete")  # no finish


def test_the_latest_finished_run_per_thing_reconciled(stripe_api):
    stripe_api.add_event(STRIPE_TYPE, created=timezone.now() - timedelta(hours=1))
    run("reconcile_stripe")
    run("reconcile_stripe")
    reconciliation_run_start(provider="github", source="github", scope="x", window=window())

    (latest,) = reconciliation_runs_latest()
    assert latest == ReconciliationRun.objects.filter(provider="stripe").first()
    assert latest.drift == 0


# --- time budgets --------------------------------------------------------------------------


def test_the_clock_only_starts_a_call_its_worst_case_still_fits():
    now = [0.0]
    clock = BudgetClock(
        30.0,
        setting="RECONCILE_RUN_BUDGET_SECONDS",
        clock=lambda: now[0],
        exhausted=ReconcileStopped,
    )
    worst = reconcile_call_worst_case("github")  # 26.5 s with the defaults
    clock.require("github", worst)
    now[0] = 30.0 - worst.seconds + 0.1
    with pytest.raises(ReconcileStopped) as stopped:
        clock.require("github", worst)
    assert str(stopped.value) == BUDGET_USED.format(
        remaining=worst.seconds - 0.1,
        budget=30.0,
        setting="RECONCILE_RUN_BUDGET_SECONDS",
        operation="github",
        worst=worst.seconds,
    )


def test_the_github_worst_case_is_computed_from_its_settings(settings):
    settings.GITHUB_MAX_RETRIES = 2
    worst = github_call_worst_case()
    assert worst.seconds == 3 * (3.0 + 10.0) + 0.5 + 1.0
    assert worst.arithmetic == "3 x (connect 3.0 s + read 10.0 s) + backoff 0.5+1.0 s = 40.5 s"


def test_a_slow_provider_stops_the_run_inside_its_budget(stripe_api, settings):
    # One call's worst case is 1.0 + 3.0 = 4.0 s; the budget covers one call, not two.
    settings.STRIPE_READ_TIMEOUT_SECONDS = 3.0
    settings.RECONCILE_RUN_BUDGET_SECONDS = 6.0
    for n in range(150):
        stripe_api.add_event(STRIPE_TYPE, created=timezone.now() - timedelta(hours=1, seconds=n))
    stripe_api.list_delay = 2.5

    run("reconcile_stripe")

    record = ReconciliationRun.objects.get()
    assert (record.status, record.pages, record.backfilled_count) == ("incomplete", 1, 100)
    assert record.error.startswith("Stopped: ") and "worst case 4.0 s" in record.error
    assert record.finished_at is not None
    assert (record.finished_at - record.started_at).total_seconds() < 6.0


def test_a_read_timeout_stops_the_run_incomplete(stripe_api, settings):
    settings.STRIPE_READ_TIMEOUT_SECONDS = 0.5
    stripe_api.add_event(STRIPE_TYPE, created=timezone.now() - timedelta(hours=1))
    stripe_api.list_delay = 1.5

    run("reconcile_stripe")

    record = ReconciliationRun.objects.get()
    assert record.status == "incomplete"
    assert record.error == "Stripe unavailable (APIConnectionError): stopped after 0 page(s)."


def test_a_budget_no_call_fits_in_fails_the_run(stripe_api, settings):
    settings.RECONCILE_RUN_BUDGET_SECONDS = 2.0
    with pytest.raises(CommandError) as failed:
        run("reconcile_stripe")
    assert str(failed.value) == RECONCILE_BUDGET_UNFIT.format(
        operation="stripe",
        arithmetic="1 x (connect 1.0 s + read 2.0 s) = 3.0 s",
        budget=2.0,
    )
    assert not stripe_api.list_requests


def test_the_nightly_run_must_end_before_django_q_kills_it(settings):
    settings.RECONCILE_RUN_BUDGET_SECONDS = 400.0
    # a command has no such limit
    assert reconcile_budget_problem(provider="stripe", scheduled=False) is None
    assert reconcile_budget_problem(
        provider="stripe", scheduled=True
    ) == RECONCILE_BUDGET_OVER_Q_TIMEOUT.format(budget=400.0, timeout=settings.Q_CLUSTER["timeout"])


def test_the_defaults_fit(settings):
    for provider in ("stripe", "github"):
        assert reconcile_budget_problem(provider=provider, scheduled=True) is None


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://api.stripe.com", True),
        ("http://127.0.0.1:8111", True),
        ("http://localhost:8111", True),
        ("http://[::1]:8111", True),
        ("http://api.stripe.com", False),
        ("http://10.0.0.5", False),
        ("ftp://127.0.0.1", False),
    ],
)
def test_only_tls_or_loopback_api_bases_are_used(url, allowed):
    if allowed:
        require_tls(url, setting="X", purpose="p")
    else:
        with pytest.raises(ReconcileFailed):
            require_tls(url, setting="X", purpose="p")


def test_a_refused_url_is_shown_without_its_credentials():
    with pytest.raises(ReconcileFailed) as failed:
        require_tls("http://user:s3cret@api.example/v1", setting="X", purpose="p")
    assert "s3cret" not in str(failed.value)
    assert "http://api.example" in str(failed.value)


# --- nightly tasks -------------------------------------------------------------------------


def test_both_nightly_runs_are_scheduled():
    entries = {e.name: (e.func, e.schedule_type) for e in SCHEDULES}
    assert entries["ingress.reconcile_stripe"] == (
        "ingress.reconcile.tasks.reconcile_stripe_nightly",
        "D",
    )
    assert entries["ingress.reconcile_github"] == (
        "ingress.reconcile.tasks.reconcile_github_nightly",
        "D",
    )


def test_the_nightly_stripe_run_returns_its_summary(stripe_api):
    stripe_api.add_event(STRIPE_TYPE, created=timezone.now() - timedelta(hours=3))

    summary = reconcile_stripe_nightly()

    assert summary.startswith("stripe reconciliation #")
    assert "missing 1, backfilled 1" in summary


def test_the_nightly_github_run_covers_every_configured_hook(github_api, settings):
    assert reconcile_github_nightly() == NO_GITHUB_HOOKS
    settings.RECONCILE_GITHUB_HOOKS = ["acme/app:7", "acme:9", "not a hook"]

    lines = reconcile_github_nightly().splitlines()

    assert lines[0].startswith("github reconciliation #") and "[repo acme/app hook 7]" in lines[0]
    assert "[org acme hook 9]" in lines[1]
    assert lines[2] == "GitHub hook spec 'not a hook' is not owner/repo:HOOK_ID or org:HOOK_ID."
    assert ReconciliationRun.objects.count() == 2
