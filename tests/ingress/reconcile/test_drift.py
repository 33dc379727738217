"""Drift: the figure, where it is recorded, and --fail-on-drift."""

from datetime import timedelta

import pytest
from django.core.management import CommandError
from django.utils import timezone

from ingress.models import ReconciliationRun
from ingress.reconcile.command import DRIFT_EXIT_CODE, OVER_SLO
from ingress.reconcile.services import drift_ratio
from tests.ingress.reconcile.conftest import STRIPE_TYPE, receive_stripe, run

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("missing", "compared", "drift"),
    [
        (0, 0, 0.0),  # nothing listed: nothing can have been lost
        (0, 250, 0.0),
        (1, 10_000, 0.0001),  # exactly the seed's SLO
        (1, 9_999, 1 / 9_999),  # just over it
        (3, 6, 0.5),
        (4, 4, 1.0),
    ],
)
def test_drift_is_missing_over_listed(missing, compared, drift):
    assert drift_ratio(missing=missing, compared=compared) == pytest.approx(drift)


def test_the_default_slo_is_the_seeds_one_hundredth_of_a_percent(settings):
    assert settings.RECONCILE_DRIFT_SLO == 0.0001


@pytest.fixture
def one_of_four_missing(client, stripe_api):
    """Stripe lists four events; three reached us: drift 25 %."""
    created = timezone.now() - timedelta(hours=1)
    events = [stripe_api.add_event(STRIPE_TYPE, created=created) for _ in range(4)]
    for event in events[:3]:
        receive_stripe(client, event)
    return events


@pytest.mark.parametrize(
    ("slo", "fails"),
    [(0.0001, True), (0.2499, True), (0.25, False), (0.5, False)],
)
def test_fail_on_drift_exits_non_zero_only_above_the_slo(settings, one_of_four_missing, slo, fails):
    settings.RECONCILE_DRIFT_SLO = slo
    if fails:
        with pytest.raises(CommandError) as over:
            run("reconcile_stripe", "--fail-on-drift")
        assert over.value.returncode == DRIFT_EXIT_CODE
        assert str(over.value) == OVER_SLO.format(drift=25.0, slo=slo * 100)
    else:
        assert "within SLO" in run("reconcile_stripe", "--fail-on-drift")
    record = ReconciliationRun.objects.get()
    assert (record.drift, record.missing_count, record.pending_count) == (0.25, 1, 3)


def test_without_the_flag_drift_over_the_slo_is_reported_not_fatal(one_of_four_missing):
    output = run("reconcile_stripe")
    assert "drift 25.0000 % (SLO 0.0100 %, OVER SLO)" in output


def test_a_dry_run_measures_drift_too(one_of_four_missing):
    with pytest.raises(CommandError) as over:
        run("reconcile_stripe", "--dry-run", "--fail-on-drift")
    assert over.value.returncode == DRIFT_EXIT_CODE
    assert not ReconciliationRun.objects.exists()


def test_a_failed_run_has_no_drift_figure_and_is_not_a_drift_failure(stripe_api, settings):
    settings.STRIPE_API_KEY = "sk_test_not_ours"
    with pytest.raises(CommandError) as failed:
        run("reconcile_stripe", "--fail-on-drift")
    assert failed.value.returncode == 1
    assert ReconciliationRun.objects.get().drift is None
