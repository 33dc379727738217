"""What the receive path needs to know about each provider type, and nothing more.

The receive path only checks that the signature header is *present* and copies the
delivery id header; all signature math happens later in ingress/verifiers/.
Header names are lower-case: that is how RawEvent.headers stores them.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ProviderSpec:
    name: str
    signature_header: str
    delivery_id_header: str = ""


PROVIDERS: dict[str, ProviderSpec] = {
    "stripe": ProviderSpec("stripe", signature_header="stripe-signature"),
    "github": ProviderSpec(
        "github", signature_header="x-hub-signature-256", delivery_id_header="x-github-delivery"
    ),
    "slack": ProviderSpec("slack", signature_header="x-slack-signature"),
    "standard": ProviderSpec(
        "standard", signature_header="webhook-signature", delivery_id_header="webhook-id"
    ),
    # Generic HMAC senders name their headers per source (see ingress/sources.py).
    "hmac": ProviderSpec("hmac", signature_header="x-signature"),
}
