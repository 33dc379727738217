from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ingress.sources import all_sources


@checks.register(checks.Tags.security)
def check_webhook_sources(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
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
def check_reconcile_budgets(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """A nightly reconciliation run must fit one call's worst case, and django-q2's timeout."""
    from ingress.reconcile.budgets import CALL_WORST_CASES, budget_fit_check
    from ingress.reconcile.errors import ReconcileFailed

    messages: list[checks.CheckMessage] = []
    for provider in CALL_WORST_CASES:
        try:
            budget_fit_check(provider=provider, scheduled=True)
        except ReconcileFailed as exc:
            messages.append(checks.Error(str(exc), id="ingress.E002"))
    return messages
