"""Provider verifiers, one module each, behind one function: `verify(source, request)`."""

import logging
from importlib import import_module

from ingress.models import RejectionReason
from ingress.sources import Source
from ingress.verifiers.base import StoredRequest, Verdict

logger = logging.getLogger(__name__)

_VERIFIER_MODULES = {
    "stripe": "ingress.verifiers.stripe",
    "github": "ingress.verifiers.github",
    "slack": "ingress.verifiers.slack",
    "standard": "ingress.verifiers.standard",
    "hmac": "ingress.verifiers.hmac",
}


def verify(source: Source, request: StoredRequest) -> Verdict:
    """Verify one stored request with its source's provider verifier.

    Verifiers return reasons for every bad input they know of; the catch-all below exists so
    that a verifier *bug* marks one row `verifier_error` (re-verifiable once fixed) instead of
    stalling the worker on the same row forever.
    """
    if not source.secrets:
        return Verdict(reason=RejectionReason.NO_SECRET_CONFIGURED)
    verifier = import_module(_VERIFIER_MODULES[source.provider]).verify
    try:
        return verifier(source, request)
    except Exception:
        logger.exception("ingress.verify.verifier_error", extra={"source": source.name})
        return Verdict(reason=RejectionReason.VERIFIER_ERROR)


__all__ = ["StoredRequest", "Verdict", "verify"]
