"""django-q2 entry points for the nightly runs (thin: they call stripe.py / github.py) and
for the signature questions (signature_questions.py)."""

import logging

from django.conf import settings

from ingress.reconcile.errors import ReconcileBusy, ReconcileInvalid
from ingress.reconcile.github import GitHubHook, github_reconcile
from ingress.reconcile.signature_questions import signature_questions_ask
from ingress.reconcile.stripe import stripe_reconcile
from kernel.processing_region import ProcessingWritesRefused

logger = logging.getLogger(__name__)

NO_GITHUB_HOOKS = "No GitHub hooks to reconcile (RECONCILE_GITHUB_HOOKS is empty)."


def reconcile_stripe_nightly() -> str:
    """The default window (RECONCILE_LOOKBACK_HOURS up to RECONCILE_SETTLE_SECONDS ago)."""
    try:
        outcome = stripe_reconcile(scheduled=True)
    except ProcessingWritesRefused as exc:
        # Scheduled in every region; it runs in the processing region only.
        logger.info("ingress.reconcile.standby", extra={"provider": "stripe"})
        return str(exc)
    except (ReconcileBusy, ReconcileInvalid) as exc:
        logger.warning("ingress.reconcile.not_started", extra={"provider": "stripe"})
        return str(exc)
    return outcome.summary(settings.RECONCILE_DRIFT_SLO)


def reconcile_github_nightly() -> str:
    """Every hook in RECONCILE_GITHUB_HOOKS, one run each; one hook's trouble stops no other."""
    lines = []
    for spec in settings.RECONCILE_GITHUB_HOOKS:
        try:
            outcome = github_reconcile(hook=GitHubHook.parse(spec), scheduled=True)
        except ProcessingWritesRefused as exc:
            logger.info("ingress.reconcile.standby", extra={"provider": "github"})
            return str(exc)
        except (ReconcileBusy, ReconcileInvalid) as exc:
            logger.warning("ingress.reconcile.not_started", extra={"provider": "github"})
            lines.append(str(exc))
            continue
        lines.append(outcome.summary(settings.RECONCILE_DRIFT_SLO))
    return "\n".join(lines) or NO_GITHUB_HOOKS


def signature_questions_github() -> str:
    """Every 5 minutes: the `github` source's open signature questions, asked of GitHub."""
    try:
        outcome = signature_questions_ask(source="github", scheduled=True)
    except ProcessingWritesRefused as exc:
        logger.info("ingress.signature_questions.standby", extra={"source": "github"})
        return str(exc)
    except ReconcileInvalid as exc:
        return str(exc)  # no `github` source configured: nothing to ask about
    return outcome.summary()
