"""Missing configuration refuses to start; it never kills rows (issue 9, finding 3).

Started in a shell without RENDER_SERVICE_URL, `dispatch_side_effects --once` used to claim a
paid recap and write it `failed` ("not_configured"). Now every dispatcher entry point — the
command (once and as its worker loop), the nightly `recover_recaps`, and their django-q2
tasks — refuses to run with one line naming what is missing and a non-zero exit, touching no
row; `manage.py check` reports the same list as errors for a deployment (DEBUG off), in the
processes that call the render service (EVENTDROP_PROCESS dispatcher or worker, or none):
the others start without it (issue 26).

The commands run as real subprocesses in a clean environment (tests/support/processes.py)
against this test's database. About 10 s for the module.
"""

import subprocess

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from outbox.models import RecapSideEffect, RecapSideEffectAttempt
from recaps.models import RecapStatus
from tests.support.processes import PYTHON, ROOT, app_env, settings_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REFUSAL = (
    "CommandError: {who} refuses to run: {problems}. No row was touched; see `manage.py check`."
)


def clean_env(*, drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    env = app_env(settings_database_url(), **extra)
    for name in drop:
        env.pop(name, None)
    return env


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    # A refusal is immediate; the timeout only stops a dispatcher loop that failed to refuse.
    return subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def snapshot(side_effect: RecapSideEffect) -> tuple:
    side_effect.refresh_from_db()
    return (
        side_effect.status,
        side_effect.attempts,
        side_effect.next_attempt_at,
        side_effect.updated_at,
        side_effect.recap.status,
        RecapSideEffectAttempt.objects.filter(side_effect=side_effect).count(),
    )


@pytest.fixture
def due_row(paid_recap):
    """A paid recap whose render row is due now: exactly what the old dispatcher killed."""
    _, side_effect = paid_recap()
    before = snapshot(side_effect)
    assert before[0] == "pending" and before[1] == 0 and before[4] == RecapStatus.PAID
    return side_effect, before


@pytest.mark.parametrize(
    ("args", "who"),
    [
        (["dispatch_side_effects", "--once"], "dispatch_side_effects"),
        (["dispatch_side_effects"], "dispatch_side_effects"),  # the worker loop
        (["recover_recaps"], "recover_recaps"),
    ],
)
def test_a_dispatcher_without_the_render_service_url_refuses_to_start(due_row, args, who):
    side_effect, before = due_row
    result = manage(*args, env=clean_env(drop=("RENDER_SERVICE_URL",)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        REFUSAL.format(who=who, problems="RENDER_SERVICE_URL is not set")
    ]
    assert result.stdout == ""
    assert snapshot(side_effect) == before


def test_every_missing_piece_is_named_in_the_one_line_even_in_development(due_row):
    side_effect, before = due_row
    env = clean_env(
        drop=("RENDER_SERVICE_URL", "RENDER_CALLBACK_URL"),
        RENDERER_WEBHOOK_SECRET="",
        DJANGO_DEBUG="1",  # a warning for `check`, still a refusal for the dispatcher
    )
    result = manage("dispatch_side_effects", "--once", env=env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        REFUSAL.format(
            who="dispatch_side_effects",
            problems=(
                "RENDER_SERVICE_URL is not set; RENDER_CALLBACK_URL is not set; "
                "RENDERER_WEBHOOK_SECRET is not set (every render callback would be rejected)"
            ),
        )
    ]
    assert snapshot(side_effect) == before


def test_check_fails_a_deployment_without_the_render_service_url():
    result = manage("check", env=clean_env(drop=("RENDER_SERVICE_URL",)))
    assert result.returncode == 1
    assert (
        "?: (outbox.E004) RENDER_SERVICE_URL is not set: the recap dispatcher and recovery "
        "refuse to run, so paid recaps wait unrendered."
    ) in result.stderr
    # The complete configuration passes (the clean environment has everything else).
    assert manage("check", env=clean_env()).returncode == 0


@pytest.mark.parametrize(
    ("kind", "refuses"),
    [("dispatcher", True), ("worker", True), ("web", False), ("inbox", False), ("release", False)],
)
def test_check_refuses_only_the_kinds_that_call_the_render_service(kind, refuses):
    env = clean_env(drop=("RENDER_SERVICE_URL", "RENDER_CALLBACK_URL"), EVENTDROP_PROCESS=kind)
    result = manage("check", env=env)
    if refuses:
        assert result.returncode == 1
        assert "?: (outbox.E004) RENDER_SERVICE_URL is not set" in result.stderr
        assert "?: (outbox.E004) RENDER_CALLBACK_URL is not set" in result.stderr
    else:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "outbox.E004" not in result.stderr


def test_an_inbox_without_the_render_service_starts_and_dispatches_nothing(due_row):
    """The inbox runs its checks, then a pass, where it used to stop on outbox.E004; the
    paid recap's render row waits for a dispatcher."""
    side_effect, before = due_row
    env = clean_env(drop=("RENDER_SERVICE_URL", "RENDER_CALLBACK_URL"), EVENTDROP_PROCESS="inbox")
    result = manage("process_inbox", "--once", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "outbox.E004" not in result.stderr
    assert snapshot(side_effect) == before


def test_the_scheduled_tasks_refuse_and_touch_no_row(due_row, settings):
    from outbox.configuration import DispatchNotConfigured
    from outbox.tasks import dispatch_side_effects, recover_recaps

    side_effect, before = due_row
    settings.RENDER_SERVICE_URL = ""
    for task in (dispatch_side_effects, recover_recaps):
        with pytest.raises(DispatchNotConfigured, match="RENDER_SERVICE_URL is not set"):
            task()
    assert snapshot(side_effect) == before


def test_the_task_refuses_as_django_q2_runs_it(due_row, settings):
    """Through django-q2's own worker (sync in the test settings, where the task's exception
    is re-raised; in a cluster it is recorded as a failed task with this line)."""
    from django_q.tasks import async_task

    from outbox.configuration import DispatchNotConfigured

    side_effect, before = due_row
    settings.RENDER_CALLBACK_URL = ""
    with pytest.raises(DispatchNotConfigured, match="RENDER_CALLBACK_URL is not set"):
        async_task("outbox.tasks.dispatch_side_effects")
    assert snapshot(side_effect) == before


# --- the check, in process ------------------------------------------------------------------


def outbox_messages() -> list[checks.CheckMessage]:
    return [m for m in checks.run_checks() if m.id and m.id.startswith("outbox.")]


def test_check_is_an_error_for_a_deployment_and_a_warning_in_development(settings):
    settings.RENDER_SERVICE_URL = ""
    settings.DEBUG = False
    assert [(m.id, m.level) for m in outbox_messages()] == [("outbox.E004", checks.ERROR)]
    with pytest.raises(SystemCheckError, match=r"outbox\.E004"):
        call_command("check")
    settings.DEBUG = True
    assert [(m.id, m.level) for m in outbox_messages()] == [("outbox.W001", checks.WARNING)]


@pytest.mark.parametrize(
    ("setting", "value", "problem"),
    [
        ("RENDER_SERVICE_URL", "render.internal:8200", "RENDER_SERVICE_URL is not an http(s) URL"),
        ("RENDER_CALLBACK_URL", "ftp://x/cb", "RENDER_CALLBACK_URL is not an http(s) URL"),
        (
            "RENDER_WEBHOOK_SOURCE",
            "render-service",
            "RENDER_WEBHOOK_SOURCE names no webhook source ('render-service')",
        ),
        (
            "RENDER_WEBHOOK_SOURCE",
            "github",
            "the webhook source 'github' is not a Standard Webhooks source (provider 'github')",
        ),
    ],
)
def test_configuration_problems_name_what_is_wrong(settings, setting, value, problem):
    from outbox.configuration import dispatch_configuration_problems

    setattr(settings, setting, value)
    assert dispatch_configuration_problems() == [problem]


def test_a_disabled_renderer_source_is_a_problem(monkeypatch):
    from ingress.sources import reset_sources_cache
    from outbox.configuration import dispatch_configuration_problems

    monkeypatch.setenv("WEBHOOK_RENDERER_ENABLED", "false")
    reset_sources_cache()
    try:
        assert dispatch_configuration_problems() == [
            "the webhook source 'renderer' is disabled (callbacks would get 404)"
        ]
    finally:
        monkeypatch.undo()
        reset_sources_cache()


def test_the_test_settings_are_a_complete_configuration():
    from outbox.configuration import dispatch_configuration_problems

    assert dispatch_configuration_problems() == []
