"""The project layer's system checks: the production web server (eventdrop/web.py) against
the webhook's budget and the sources' limits, and the process kind (EVENTDROP_PROCESS).

They check eventdrop/web.py, so they live beside it, above the apps: ingress, which they also
read, imports nothing of the project layer. Their ids are the ones they had in ingress
(ingress.E003, ingress.W002), so the README, runbooks and tests keep naming them.
"""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from eventdrop.budgets import raw_event_store_worst_case
from eventdrop.processes import KINDS
from eventdrop.web import WebServerConfig
from ingress.sources import all_sources


@checks.register()
def check_web_server_limits(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The production server's own bounds (eventdrop/web.py) against the webhook's budget and
    the sources' limits: a request may spend the header read timeout, then the body read
    deadline, then the store's worst case, and all of it must fit the route's budget."""
    try:
        server = WebServerConfig.from_environ()
    except ValueError as exc:
        return [checks.Error(f"Web server settings (WEB_*): {exc}", id="ingress.E003")]
    messages: list[checks.CheckMessage] = []
    header = server.header_read_timeout_seconds
    body = float(settings.WEBHOOK_BODY_READ_TIMEOUT_SECONDS)
    store = raw_event_store_worst_case()
    total = header + body + store.seconds
    budget = float(settings.WEBHOOK_REQUEST_BUDGET_SECONDS)
    if total > budget:
        messages.append(
            checks.Error(
                f"webhook receive worst case headers {header:.1f} s "
                f"(WEB_HEADER_READ_TIMEOUT_SECONDS) + body {body:.1f} s "
                f"(WEBHOOK_BODY_READ_TIMEOUT_SECONDS) + {store.terms} = {total:.1f} s "
                f"exceeds the {budget:.1f} s budget of the webhook receive request "
                "(WEBHOOK_REQUEST_BUDGET_SECONDS).",
                id="ingress.E003",
            )
        )
    try:
        sources = all_sources()
    except ImproperlyConfigured:
        return messages  # reported by ingress.E001
    for source in sources.values():
        if source.enabled and source.max_header_bytes > server.max_header_bytes:
            messages.append(
                checks.Warning(
                    f"Webhook source {source.name!r} allows {source.max_header_bytes} bytes of "
                    f"headers, but the web server answers 431 past {server.max_header_bytes}.",
                    hint="Raise WEB_MAX_HEADER_BYTES or lower the source's max_header_bytes.",
                    id="ingress.W002",
                )
            )
    return messages


@checks.register()
def check_process_kind(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A misspelt kind would otherwise go unnoticed: it connects with DATABASE_URL instead of
    its role's URL, and eventdrop/processes.py checks everything for it."""
    kind = settings.PROCESS_KIND
    if not kind or kind in KINDS:
        return []
    return [
        checks.Error(
            f"EVENTDROP_PROCESS={kind!r} is not a process kind.",
            hint=f"One of {', '.join(KINDS)}; or unset (a developer's shell: every check).",
            id="eventdrop.E003",
        )
    ]
