"""System checks of the outbox. `manage.py check` fails on every Error here.

- outbox.E001  a worst case exceeds the budget of a caller (the table below, `CALLERS`; the
  arithmetic is kernel/budgets.py)
- outbox.E002  django-q2's task timeout does not cover one scheduled run
- outbox.E003  the stale threshold would re-arm a live dispatch
- outbox.E004  the dispatcher's configuration is incomplete (a deployment: DEBUG off);
  outbox.W001  the same in development (DEBUG on), where the dispatcher still refuses to run.
  Checked for the process kinds that call the render service (kernel/process_kinds.py),
  and for every kind by `check --deploy`; never by `migrate`.
- outbox.E005  the rendering deadline settings are not sane or contradict each other
- outbox.E006  the side effects' retry settings cannot work; outbox.W002  their horizon is
  shorter than the backoff alone (it extends nothing). Both show the give-up arithmetic.
"""

from collections.abc import Callable

from django.conf import settings
from django.core import checks

from ingress.archive import ArchiveClientConfig, archive_enabled, calls_per_day
from ingress.sources import all_sources
from kernel.budgets import (
    BudgetViolation,
    Caller,
    GiveUp,
    WorstCase,
    archive_day_worst_case,
    budget_violations,
    database_statement_worst_case,
    give_up_arithmetic,
    q_task_timeout,
    raw_event_store_worst_case,
    render_dispatch_worst_case,
    render_status_worst_case,
    stripe_call_worst_case,
)
from kernel.process_kinds import RENDER_SERVICE, kinds_needing, register_configuration_check
from outbox.configuration import dispatch_configuration_problems
from outbox.render_client import RenderClientConfig
from outbox.services import outbox_retry_strategy


def _archive_day() -> WorstCase:
    """One day's archive (ingress/archive.py) with the sources configured now."""
    if not archive_enabled():
        return archive_day_worst_case(None, calls=0)
    sources = sum(1 for source in all_sources().values() if source.enabled)
    return archive_day_worst_case(
        ArchiveClientConfig.from_settings(), calls=calls_per_day(sources)
    )


# Each operation's worst case, computed from the configuration its client runs with now.
OPERATIONS: dict[str, Callable[[], WorstCase]] = {
    "render.dispatch": lambda: render_dispatch_worst_case(RenderClientConfig.from_settings()),
    "render.status": lambda: render_status_worst_case(RenderClientConfig.from_settings()),
    "stripe.checkout_session": stripe_call_worst_case,
    "database.statement": database_statement_worst_case,
    "ingress.raw_event_store": raw_event_store_worst_case,
    "ingress.archive_day": _archive_day,
}

# Who waits for what. A new synchronous use of a slow operation is added here, and the
# check then holds it against its caller's budget before the code can ship.
CALLERS: list[Caller] = [
    # A run claims a row only while what is left covers one worst-case dispatch.
    Caller("outbox dispatcher run", "OUTBOX_DISPATCH_BUDGET_SECONDS", "render.dispatch"),
    # Likewise a render-check run (outbox/render_status.py) asks only while one check fits.
    Caller("render check run", "RENDER_CHECK_BUDGET_SECONDS", "render.status"),
    Caller("recap purchase request", "RECAP_PURCHASE_BUDGET_SECONDS", "stripe.checkout_session"),
    # The receive path is one INSERT; nothing slow may ever join it.
    Caller("webhook receive request", "WEBHOOK_REQUEST_BUDGET_SECONDS", "ingress.raw_event_store"),
    # A maintenance run starts a day's archive only while its worst case fits what is left.
    Caller(
        "partition maintenance run", "RAW_EVENT_PARTITIONS_BUDGET_SECONDS", "ingress.archive_day"
    ),
]


def time_budget_violations() -> list[BudgetViolation]:
    return budget_violations(CALLERS, OPERATIONS)


def side_effect_give_up() -> GiveUp:
    """ValueError on a retry setting that cannot work."""
    return give_up_arithmetic(outbox_retry_strategy())


@checks.register()
def check_time_budgets(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = [
        checks.Error(
            violation.message,
            hint=(
                f"Lower the timeouts or retries behind {violation.caller.operation}, or move "
                "the call out of that path (an outbox row instead of a call)."
            ),
            id="outbox.E001",
        )
        for violation in time_budget_violations()
    ]
    budget = settings.OUTBOX_DISPATCH_BUDGET_SECONDS
    check_budget = settings.RENDER_CHECK_BUDGET_SECONDS
    # One scheduled dispatcher task is a dispatch run followed by a render-check run
    # (outbox/tasks.py); the nightly recovery spends one render-check run.
    task = budget + check_budget
    q_timeout = q_task_timeout()
    if q_timeout is not None and q_timeout <= task:
        messages.append(
            checks.Error(
                f"django-q2 kills a task after {q_timeout:g} s (Q_CLUSTER timeout), inside the "
                f"dispatcher task's {budget:.1f} s dispatch + {check_budget:.1f} s render "
                f"checks = {task:.1f} s: runs would die mid-dispatch and leave rows "
                "processing until they go stale.",
                hint=(
                    "Raise Q_TIMEOUT above OUTBOX_DISPATCH_BUDGET_SECONDS + "
                    "RENDER_CHECK_BUDGET_SECONDS."
                ),
                id="outbox.E002",
            )
        )
    stale = settings.OUTBOX_STALE_PROCESSING_SECONDS
    if stale <= budget:
        messages.append(
            checks.Error(
                f"OUTBOX_STALE_PROCESSING_SECONDS ({stale} s) must exceed the dispatcher's "
                f"{budget:.1f} s budget: a live dispatch would be re-armed and run twice.",
                id="outbox.E003",
            )
        )
    return messages


@register_configuration_check(RENDER_SERVICE)
def check_dispatch_configuration() -> list[checks.CheckMessage]:
    """The same list the dispatcher refuses to start on (outbox/configuration.py)."""
    problems = dispatch_configuration_problems()
    if not problems:
        return []
    # Development may run half the system on purpose; a deployment may not.
    level, check_id = (
        (checks.Warning, "outbox.W001") if settings.DEBUG else (checks.Error, "outbox.E004")
    )
    return [
        level(
            f"{problem}: the recap dispatcher and recovery refuse to run, so paid recaps wait "
            "unrendered.",
            hint=(
                "Set RENDER_SERVICE_URL, RENDER_CALLBACK_URL and RENDERER_WEBHOOK_SECRET for "
                f"{kinds_needing(RENDER_SERVICE)} (locally scripts/run-local.sh does)."
            ),
            id=check_id,
        )
        for problem in problems
    ]


@checks.register()
def check_rendering_deadline(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """A recap `rendering` is asked about at rendering_at + expected + margin, then every
    interval (outbox/render_status.py). Those numbers must be usable and consistent."""
    expected = settings.RENDER_EXPECTED_SECONDS
    margin = settings.RENDER_CALLBACK_MARGIN_SECONDS
    interval = settings.RENDER_CHECK_INTERVAL_SECONDS
    errors: list[str] = []
    if expected <= 0:
        errors.append(f"RENDER_EXPECTED_SECONDS must be positive, got {expected}")
    if margin < 0:
        errors.append(f"RENDER_CALLBACK_MARGIN_SECONDS must not be negative, got {margin}")
    if interval <= 0:
        errors.append(f"RENDER_CHECK_INTERVAL_SECONDS must be positive, got {interval}")
    worst = render_status_worst_case(RenderClientConfig.from_settings())
    if 0 < interval <= worst.seconds:
        # A claim schedules the next check one interval ahead; a check still running then
        # would be asked about a second time, in parallel.
        errors.append(
            f"RENDER_CHECK_INTERVAL_SECONDS ({interval:.1f} s) must exceed one status "
            f"check's worst case ({worst.arithmetic})"
        )
    if settings.RENDER_CHECK_BATCH_SIZE < 1:
        errors.append("RENDER_CHECK_BATCH_SIZE must be at least 1")
    deadline = expected + margin
    stuck = settings.RECAP_STUCK_RENDERING_HOURS * 3600
    if deadline >= stuck:
        errors.append(
            f"the rendering deadline (expected {expected:.1f} s + margin {margin:.1f} s = "
            f"{deadline:.1f} s) must be shorter than RECAP_STUCK_RENDERING_HOURS "
            f"({stuck} s): recaps would be reported stuck before anyone asked about them"
        )
    return [checks.Error(f"{error}.", id="outbox.E005") for error in errors]


@checks.register()
def check_side_effect_give_up(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    try:
        give_up = side_effect_give_up()
    except ValueError as exc:
        return [checks.Error(f"Side effects cannot be retried: {exc}.", id="outbox.E006")]
    if give_up.horizon_seconds < give_up.backoff_seconds:
        return [
            checks.Warning(
                f"Side effects: {give_up.arithmetic}. The horizon is shorter than the "
                "backoff alone, so it keeps no row alive longer than its attempts do.",
                hint="Raise OUTBOX_TRANSIENT_HORIZON_SECONDS (default 24 h).",
                id="outbox.W002",
            )
        ]
    return []
