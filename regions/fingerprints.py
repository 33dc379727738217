"""Fingerprints of the webhook secrets: what regions compare instead of the secrets."""

import hashlib

from ingress.sources import all_sources


def secret_fingerprints() -> dict[str, list[str]]:
    """Source name -> the sorted sha256 hex digests of its secrets (order-free, so a rotation
    written in another order is the same set)."""
    return {
        source.name: sorted(
            hashlib.sha256(secret.encode()).hexdigest() for secret in source.secrets
        )
        for source in all_sources().values()
    }
