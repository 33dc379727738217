"""Process kinds (EVENTDROP_PROCESS) and the outbound configuration each one needs: a check
registered with `register_configuration_check(need)` stops only the kinds in `NEEDED_BY`, and
`check --deploy` reports it for the rest (docs/checks.md, "Which process needs what").
"""

from collections.abc import Callable, Collection
from typing import Any

from django.conf import settings
from django.core import checks

KINDS = ("web", "console", "inbox", "dispatcher", "worker", "release")

RENDER_SERVICE = "the render service"
STRIPE_API = "Stripe's API"

# Which kinds call out with which configuration. `web` only stores webhooks and `release`
# only migrates, writes schedules and partitions: neither calls out.
NEEDED_BY: dict[str, tuple[str, ...]] = {
    # RENDER_SERVICE_URL, RENDER_CALLBACK_URL and the renderer source (outbox.E004): the
    # dispatcher, and the worker, whose django-q2 schedule dispatches and recovers too. The
    # inbox's handlers only record a render's result (outbox/handlers.py).
    RENDER_SERVICE: ("dispatcher", "worker"),
    # STRIPE_API_KEY (recaps.W001): the buyer API's checkout sessions (console) and the
    # nightly Stripe reconciliation (worker). The inbox's handlers read the event only.
    STRIPE_API: ("console", "worker"),
}

CheckFunction = Callable[[], list[checks.CheckMessage]]


def process_kind(*, databases: Collection[str] | None) -> str:
    """This process's kind, or "" for none (a developer's shell, `make run`: every need).
    Without EVENTDROP_PROCESS, a check run given `databases` (Django gives them to `migrate`
    and `check --database`) is the release phase, which never calls out."""
    if settings.PROCESS_KIND:
        return settings.PROCESS_KIND
    return "release" if databases is not None else ""


def needed_here(need: str, *, databases: Collection[str] | None) -> bool:
    kind = process_kind(databases=databases)
    # No kind, or an unknown one (eventdrop.E003), checks everything: a typo lowers no bar.
    return kind not in KINDS or kind in NEEDED_BY[need]


def kinds_needing(need: str) -> str:
    """For a hint: 'the dispatcher and worker processes (EVENTDROP_PROCESS)'."""
    return f"the {' and '.join(NEEDED_BY[need])} processes (EVENTDROP_PROCESS)"


def register_configuration_check(need: str) -> Callable[[CheckFunction], CheckFunction]:
    """Register `check` (what is wrong with `need`'s configuration) twice: as a check of the
    processes whose kind needs it, and as a deploy check of the others, so that `manage.py
    check --deploy` reports it once whatever the kind."""

    def register(check: CheckFunction) -> CheckFunction:
        def for_this_process(
            app_configs: Any = None, databases: Collection[str] | None = None, **kwargs: Any
        ) -> list[checks.CheckMessage]:
            return check() if needed_here(need, databases=databases) else []

        def for_the_deployment(
            app_configs: Any = None, databases: Collection[str] | None = None, **kwargs: Any
        ) -> list[checks.CheckMessage]:
            return [] if needed_here(need, databases=databases) else check()

        checks.register(for_this_process)
        checks.register(for_the_deployment, deploy=True)
        return check

    return register
