"""The ingress app's system checks: its sources, its reconciliation budgets, the raw event
store's keys and archive. The web server's own limits are checked in eventdrop/checks.py."""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ingress.sources import all_sources
from kernel.budgets import (
    RECONCILE_CALL_WORST_CASES,
    reconcile_budget_problem,
)


@checks.register(checks.Tags.security)
def check_webhook_sources(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    try:
        sources = all_sources()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="ingress.E001")]
    messages: list[checks.CheckMessage] = []
    for source in sources.values():
        if source.enabled and not source.has_secret:
            messages.append(
                checks.Warning(
                    f"Webhook source {source.name!r} has no secret: every event it receives "
                    "will be stored but rejected as no_secret_configured.",
                    hint=f"Set {source.secrets_env} (comma-separate several during rotation).",
                    id="ingress.W001",
                )
            )
    return messages


@checks.register()
def check_reconcile_budgets(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A nightly reconciliation run must fit one call's worst case, and django-q2's timeout."""
    problems = (
        reconcile_budget_problem(provider=provider, scheduled=True)
        for provider in RECONCILE_CALL_WORST_CASES
    )
    return [checks.Error(problem, id="ingress.E002") for problem in problems if problem]


@checks.register(checks.Tags.security)
def check_raw_event_encryption_keys(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """RAW_EVENT_ENCRYPTION_KEYS must parse: the receive path encrypts with the first key, and
    a key that does not parse would fail every webhook (or leave old rows unreadable)."""
    from ingress.encryption import RawEventKeyError, parse_keys

    try:
        parse_keys(settings.RAW_EVENT_ENCRYPTION_KEYS)
    except RawEventKeyError as exc:
        return [
            checks.Error(
                str(exc),
                hint="Generate a key with `python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'`; the first key encrypts, all decrypt.",
                id="ingress.E004",
            )
        ]
    return []


@checks.register()
def check_raw_event_archive(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """With RAW_EVENT_ARCHIVE_ENABLED, partitions are dropped only after their archive is
    verified: settings that cannot reach a bucket would keep every partition forever, and
    unbounded S3 calls could outlast the maintenance task (its budget: kernel/budgets.py)."""
    if not settings.RAW_EVENT_ARCHIVE_ENABLED:
        return []
    problems = []
    if not settings.RAW_EVENT_ARCHIVE_BUCKET:
        problems.append("RAW_EVENT_ARCHIVE_BUCKET is empty")
    if settings.AWS_S3_ENDPOINT_URL and not settings.AWS_S3_ENDPOINT_URL.startswith(
        ("https://", "http://")
    ):
        problems.append("AWS_S3_ENDPOINT_URL must start with https:// or http://")
    timeouts = (
        "RAW_EVENT_ARCHIVE_CONNECT_TIMEOUT_SECONDS",
        "RAW_EVENT_ARCHIVE_READ_TIMEOUT_SECONDS",
    )
    for name in timeouts:
        if not float(getattr(settings, name)) > 0:
            problems.append(f"{name} must be above 0 (0 or less means no bound)")
    if int(settings.RAW_EVENT_ARCHIVE_MAX_ATTEMPTS) < 1:
        problems.append("RAW_EVENT_ARCHIVE_MAX_ATTEMPTS must be at least 1")
    try:
        import boto3  # noqa: F401
        import storages.backends.s3  # noqa: F401
    except ImportError as exc:
        problems.append(f"django-storages with boto3 is not installed ({exc.name})")
    return [
        checks.Error(
            f"Raw event archive: {problem}.",
            hint="See README, 'Partitions and retention': RAW_EVENT_ARCHIVE_* and AWS_*.",
            id="ingress.E005",
        )
        for problem in problems
    ]


@checks.register()
def check_delivery_retries(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The deliveries' give-up arithmetic (kernel/retry.py's finality rule, with the
    DELIVERY_* settings), and the stale threshold against the longest a batch can run.

    - ingress.E010  the retry settings cannot work
    - ingress.W010  the horizon is shorter than the backoff alone (it extends nothing)
    - ingress.W011  DELIVERY_STALE_AFTER_SECONDS does not exceed INBOX_BATCH_SIZE x the
                    statement timeout. A warning, not an error: a batch locks its claims
                    while it runs and the re-arm skips locked rows, and every outcome is
                    fenced, so no handler's effect happens twice; but between a batch's
                    steps (its per-delivery fallback, recording its failures) a live
                    worker's rows could be re-armed and run again by another worker
    """
    from ingress.deliveries import delivery_retry_strategy
    from kernel.budgets import delivery_batch_worst_case, give_up_arithmetic

    messages: list[checks.CheckMessage] = []
    try:
        give_up = give_up_arithmetic(
            delivery_retry_strategy(),
            attempts_setting="DELIVERY_MAX_ATTEMPTS",
            horizon_setting="DELIVERY_TRANSIENT_HORIZON_SECONDS",
        )
    except ValueError as exc:
        messages.append(checks.Error(f"Deliveries cannot be retried: {exc}.", id="ingress.E010"))
    else:
        if give_up.horizon_seconds < give_up.backoff_seconds:
            messages.append(
                checks.Warning(
                    f"Deliveries: {give_up.arithmetic}. The horizon is shorter than the "
                    "backoff alone, so it keeps no delivery alive longer than its attempts do.",
                    hint="Raise DELIVERY_TRANSIENT_HORIZON_SECONDS (default 3 days, Stripe's).",
                    id="ingress.W010",
                )
            )
    stale = float(settings.DELIVERY_STALE_AFTER_SECONDS)
    batch = delivery_batch_worst_case(int(settings.INBOX_BATCH_SIZE))
    if stale <= batch.seconds:
        messages.append(
            checks.Warning(
                f"DELIVERY_STALE_AFTER_SECONDS ({stale:.0f} s) does not exceed the longest a "
                f"claimed batch may run, {batch.arithmetic}: a live worker's deliveries may "
                "be re-armed between its steps and run again elsewhere (fenced: once, not "
                "twice, but for nothing).",
                hint="Raise DELIVERY_STALE_AFTER_SECONDS, or lower INBOX_BATCH_SIZE or "
                "DATABASE_STATEMENT_TIMEOUT_MS.",
                id="ingress.W011",
            )
        )
    return messages


@checks.register()
def check_inbox_claim(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The inbox's claim (ingress/inbox.py): its byte budget, its lease, the deaths allowed.

    - ingress.E012  a setting that cannot work: INBOX_BATCH_BYTES below 1,
                    INBOX_CLAIM_LEASE_SECONDS not above 0, INBOX_MAX_WORKER_DEATHS below 2
                    (one death in a batch says nothing about any one row of it)
    - ingress.W012  INBOX_BATCH_BYTES below the largest source's max_body_bytes (each such
                    body is a batch of its own: correct, but a flood of them drains one
                    claim per body); or a lease shorter than the worker's longest error
                    backoff, so that a worker whose database went away may not give its
                    claims back before another worker takes them (one death counted, for
                    nothing, on each of their rows)
    """
    from kernel.worker_loop import MAX_ERROR_SLEEP_SECONDS

    problems = []
    if int(settings.INBOX_BATCH_BYTES) < 1:
        problems.append("INBOX_BATCH_BYTES must be at least 1 (a claim takes one row at least)")
    if not float(settings.INBOX_CLAIM_LEASE_SECONDS) > 0:
        problems.append("INBOX_CLAIM_LEASE_SECONDS must be above 0")
    if int(settings.INBOX_MAX_WORKER_DEATHS) < 2:
        problems.append(
            "INBOX_MAX_WORKER_DEATHS must be at least 2: a death in a batch is no evidence "
            "about any one row of it, only deaths with the row alone are"
        )
    messages: list[checks.CheckMessage] = [
        checks.Error(f"Inbox claim: {problem}.", id="ingress.E012") for problem in problems
    ]
    try:
        sources = all_sources()
    except ImproperlyConfigured:
        sources = {}  # ingress.E001 says why
    largest = max(sources.values(), key=lambda source: source.max_body_bytes, default=None)
    budget = int(settings.INBOX_BATCH_BYTES)
    if largest is not None and 0 < budget < largest.max_body_bytes:
        messages.append(
            checks.Warning(
                f"INBOX_BATCH_BYTES ({budget}) is below source {largest.name!r}'s "
                f"max_body_bytes ({largest.max_body_bytes}): each body that large is claimed "
                "alone, one claim and one commit per event.",
                hint="Raise INBOX_BATCH_BYTES (default 32 MiB), or lower the source's limit.",
                id="ingress.W012",
            )
        )
    lease = float(settings.INBOX_CLAIM_LEASE_SECONDS)
    if 0 < lease < MAX_ERROR_SLEEP_SECONDS:
        messages.append(
            checks.Warning(
                f"INBOX_CLAIM_LEASE_SECONDS ({lease:g} s) is shorter than the worker's longest "
                f"error backoff ({MAX_ERROR_SLEEP_SECONDS:g} s): a worker whose database went "
                "away may not give its claims back before another worker takes them over, and "
                "each such row is counted a worker death it did not cause.",
                hint="Raise INBOX_CLAIM_LEASE_SECONDS (default 60 s).",
                id="ingress.W012",
            )
        )
    return messages


@checks.register()
def check_handler_limits(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Each handler's rate and concurrency (ingress/deliveries/pace.py) against the replay SLO.

    - ingress.E017  a limit that cannot work (a rate not above 0, a count below 1, an
                    override for a handler nobody registered), or a rate that cannot replay
                    the handler's declared replay_volume within BULK_JOB_REPLAY_SLO_SECONDS
    - ingress.W017  a rate without a declared replay_volume: how many events it replays
                    within the SLO, so that a larger replay is known to take longer
    """
    from ingress.deliveries.pace import handler_limits
    from ingress.handlers import all_handlers, check_limits

    slo = float(settings.BULK_JOB_REPLAY_SLO_SECONDS)
    specs = {spec.name: spec for spec in all_handlers()}
    messages: list[checks.CheckMessage] = []
    for name, override in sorted(settings.HANDLER_LIMITS.items()):
        if name not in specs:
            messages.append(
                checks.Error(
                    f"HANDLER_LIMITS names {name!r}, which is not a registered handler.",
                    hint="manage.py list_handlers prints their names.",
                    id="ingress.E017",
                )
            )
            continue
        unknown = (
            set(override) - {"rate", "concurrency", "replay_volume"}
            if isinstance(override, dict)
            else {"(not an object)"}
        )
        try:
            if unknown:
                raise ValueError(
                    f"unknown keys {sorted(unknown)}; known: rate, concurrency, replay_volume"
                )
            check_limits(**override)
        except ValueError as exc:
            messages.append(checks.Error(f"HANDLER_LIMITS[{name!r}]: {exc}.", id="ingress.E017"))
    if messages:
        return messages
    for name, spec in specs.items():
        limits = handler_limits(spec)
        if limits.rate is None:
            continue
        clears = int(limits.rate * slo)
        if limits.replay_volume is not None and clears < limits.replay_volume:
            messages.append(
                checks.Error(
                    f"Handler {name} runs at most {limits.rate:g} a second: a replay of its "
                    f"replay_volume ({limits.replay_volume:,} events) takes "
                    f"{limits.replay_volume / limits.rate:,.0f} s, past the replay SLO "
                    f"({slo:g} s).",
                    hint="Raise its rate, lower its replay_volume, or raise "
                    "BULK_JOB_REPLAY_SLO_SECONDS (HANDLER_LIMITS overrides per environment).",
                    id="ingress.E017",
                )
            )
        elif limits.replay_volume is None:
            messages.append(
                checks.Warning(
                    f"Handler {name} runs at most {limits.rate:g} a second: a bulk replay "
                    f"clears {clears:,} of its events within the replay SLO ({slo:g} s), and a "
                    "larger one takes longer.",
                    hint="Declare its replay_volume (the replay it must clear in time) to have "
                    "this checked, as an error when the rate cannot.",
                    id="ingress.W017",
                )
            )
    return messages
