"""The project layer's system checks: the production web server (eventdrop/web.py) against
each webhook source's budget and limits, and the process kind (EVENTDROP_PROCESS).

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

from eventdrop.web import WebServerConfig
from ingress.sources import Source, all_sources
from kernel.budgets import webhook_budget_seconds, webhook_receive_worst_case
from kernel.process_kinds import KINDS


@checks.register()
def check_web_server_limits(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The production server's own bounds (eventdrop/web.py) against each webhook source's
    budget and limits: a request may spend the header read timeout, then the body read, the
    queue wait and the store under one deadline, what its source's budget leaves
    (kernel/budgets.py); a source the header leaves nothing of could never be answered."""
    try:
        server = WebServerConfig.from_environ()
    except ValueError as exc:
        return [checks.Error(f"Web server settings (WEB_*): {exc}", id="ingress.E003")]
    try:
        sources = all_sources()
    except ImproperlyConfigured:
        return []  # reported by ingress.E001
    messages: list[checks.CheckMessage] = []
    header = server.header_read_timeout_seconds
    for source in sources.values():
        if not source.enabled:
            continue
        budget = webhook_budget_seconds(source.timeout_seconds)
        if header >= budget:
            worst = webhook_receive_worst_case(budget=budget, header=header)
            messages.append(
                checks.Error(
                    f"Webhook source {source.name!r}: receive worst case {worst.arithmetic}, "
                    f"against its {budget:.1f} s budget ({_budget_origin(source)}): the header "
                    "read leaves nothing for the body read, the queue wait and the store.",
                    hint="Lower WEB_HEADER_READ_TIMEOUT_SECONDS (every source shares it).",
                    id="ingress.E003",
                )
            )
        if source.max_body_bytes > server.max_body_bytes_in_flight:
            messages.append(
                checks.Error(
                    f"Webhook source {source.name!r} accepts bodies of {source.max_body_bytes} "
                    f"bytes, but a web process holds at most {server.max_body_bytes_in_flight} "
                    "bytes of bodies at once (WEB_MAX_BODY_BYTES_IN_FLIGHT): its largest "
                    "would always be answered 503.",
                    hint="Raise WEB_MAX_BODY_BYTES_IN_FLIGHT or lower the source's "
                    "max_body_bytes.",
                    id="ingress.E003",
                )
            )
        if source.max_header_bytes > server.max_header_bytes:
            messages.append(
                checks.Warning(
                    f"Webhook source {source.name!r} allows {source.max_header_bytes} bytes of "
                    f"headers, but the web server answers 431 past {server.max_header_bytes}.",
                    hint="Raise WEB_MAX_HEADER_BYTES or lower the source's max_header_bytes.",
                    id="ingress.W002",
                )
            )
    return messages


def _budget_origin(source: Source) -> str:
    """Which setting the budget comes from (kernel.budgets.webhook_budget_seconds)."""
    timeout = source.timeout_seconds
    if timeout is not None and timeout < settings.WEBHOOK_REQUEST_BUDGET_SECONDS:
        return "its timeout_seconds, its sender's timeout"
    return "WEBHOOK_REQUEST_BUDGET_SECONDS"


@checks.register()
def check_process_kind(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A misspelt kind would otherwise go unnoticed: it connects with DATABASE_URL instead of
    its role's URL, and kernel/process_kinds.py checks everything for it."""
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
