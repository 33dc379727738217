"""The one way this project builds a Stripe SDK client.

Explicit (connect, read) timeouts and a bounded number of SDK retries — the SDK's own default
is an 80 s timeout — so that kernel.budgets.stripe_call_worst_case, which adds exactly these
settings up, holds for every Stripe call we make (checkout, reconciliation). Callers check
their own configuration first; each reports a missing key in its own words.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import stripe
from django.conf import settings


@contextmanager
def stripe_client() -> Iterator[stripe.StripeClient]:
    http_client = stripe.RequestsClient(
        timeout=(settings.STRIPE_CONNECT_TIMEOUT_SECONDS, settings.STRIPE_READ_TIMEOUT_SECONDS)
    )
    try:
        yield stripe.StripeClient(
            settings.STRIPE_API_KEY,
            base_addresses={"api": settings.STRIPE_API_BASE},
            http_client=http_client,
            max_network_retries=settings.STRIPE_MAX_NETWORK_RETRIES,
        )
    finally:
        # The requests session behind it holds pooled connections until closed.
        http_client.close()
