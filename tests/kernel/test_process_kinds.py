"""Checks per process kind (issue 26): a missing piece of outbound configuration stops only the
processes whose kind needs it (kernel/process_kinds.py `NEEDED_BY`), `migrate` never, and
`check --deploy` reports it once whatever the kind.

In process, through Django's own check runner with the arguments its commands pass: `check`
runs the checks without databases, `migrate` with `databases=[alias]`, `check --deploy` with
the deployment checks. The subprocesses of the same are in test_deploy_check.py and
tests/outbox/test_config_refusal.py.
"""

import re

import pytest
from django.core import checks

from kernel.process_kinds import KINDS, NEEDED_BY, RENDER_SERVICE, STRIPE_API
from tests.support.processes import ROOT

# What a missing piece of configuration reports (in a deployment: DEBUG off).
REPORTED_AS = {RENDER_SERVICE: "outbox.E004", STRIPE_API: "recaps.W001"}


@pytest.fixture
def nothing_outbound(settings):
    """Production, with only the web process's settings: no render service, no Stripe."""
    settings.DEBUG = False
    settings.RENDER_SERVICE_URL = ""
    settings.STRIPE_API_KEY = ""
    return settings


def reported(**run_checks_kwargs) -> list[str]:
    ids = {"outbox.E004", "recaps.W001", "eventdrop.E003"}
    return sorted(m.id for m in checks.run_checks(**run_checks_kwargs) if m.id in ids)


def test_every_need_is_reported_as_one_check():
    assert set(REPORTED_AS) == set(NEEDED_BY)
    assert all(set(kinds) <= set(KINDS) for kinds in NEEDED_BY.values())


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_is_stopped_only_by_what_it_needs(nothing_outbound, kind):
    nothing_outbound.PROCESS_KIND = kind
    expected = sorted(REPORTED_AS[need] for need, kinds in NEEDED_BY.items() if kind in kinds)
    assert reported() == expected
    # Its `migrate` checks the same as its `check`.
    assert reported(databases=["default"]) == expected


@pytest.mark.parametrize("kind", ["", *KINDS])
def test_check_deploy_reports_everything_once_whatever_the_kind(nothing_outbound, kind):
    nothing_outbound.PROCESS_KIND = kind
    assert reported(include_deployment_checks=True) == ["outbox.E004", "recaps.W001"]
    assert reported(include_deployment_checks=True, databases=["default"]) == [
        "outbox.E004",
        "recaps.W001",
    ]


def test_without_a_kind_check_reports_everything_and_migrate_nothing(nothing_outbound):
    nothing_outbound.PROCESS_KIND = ""
    assert reported() == ["outbox.E004", "recaps.W001"]  # a developer's `manage.py check`
    assert reported(databases=["default"]) == []  # `manage.py migrate`: the release's needs


def test_a_misspelt_kind_is_an_error_and_checks_everything(nothing_outbound):
    nothing_outbound.PROCESS_KIND = "dispatch"
    assert reported() == ["eventdrop.E003", "outbox.E004", "recaps.W001"]
    assert reported(databases=["default"]) == ["eventdrop.E003", "outbox.E004", "recaps.W001"]


def test_the_development_level_is_kept(nothing_outbound):
    nothing_outbound.DEBUG = True
    nothing_outbound.PROCESS_KIND = "dispatcher"
    assert [(m.id, m.level) for m in checks.run_checks() if (m.id or "").startswith("outbox.")] == [
        ("outbox.W001", checks.WARNING)
    ]


def test_the_procfile_names_each_process_by_a_known_kind():
    lines = dict(
        line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line
    )
    kinds = {
        name: re.findall(r"EVENTDROP_PROCESS=(\w+)", command) for name, command in lines.items()
    }
    # The web line serves the console too (no split tier), so it takes no kind; its server
    # runs no system checks.
    assert kinds == {
        "release": ["release"],
        "web": [],
        "worker": ["worker"],
        "inbox": ["inbox"],
        "dispatcher": ["dispatcher"],
    }
