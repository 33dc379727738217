"""System checks for recaps: configuration the purchase path needs.

- recaps.W001  STRIPE_API_KEY is not set; checked for the process kinds that call Stripe's
  API (kernel/process_kinds.py), and for every kind by `check --deploy`
- recaps.E001  RECAP_MIN_PHOTOS is below 1
- recaps.E002  nothing receives the paid and withdrawn signals (the outbox app is missing)
"""

from django.conf import settings
from django.core import checks

from kernel.process_kinds import STRIPE_API, kinds_needing, register_configuration_check
from recaps.signals import recap_paid, recap_payment_withdrawn


@register_configuration_check(STRIPE_API)
def check_stripe_api_key() -> list[checks.CheckMessage]:
    if settings.STRIPE_API_KEY:
        return []
    return [
        checks.Warning(
            "STRIPE_API_KEY is not set: recap purchases answer 503 and the nightly Stripe "
            "reconciliation fails.",
            hint=f"Set STRIPE_API_KEY (sk_live_… / sk_test_…) for {kinds_needing(STRIPE_API)}.",
            id="recaps.W001",
        )
    ]


@checks.register()
def check_recap_configuration(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    # The render service's settings are the dispatcher's: outbox.E004 / W001
    # (outbox/configuration.py), one list for the check and the refusal to run.
    messages: list[checks.CheckMessage] = []
    if settings.RECAP_MIN_PHOTOS < 1:
        messages.append(checks.Error("RECAP_MIN_PHOTOS must be at least 1.", id="recaps.E001"))
    if not (recap_paid.has_listeners() and recap_payment_withdrawn.has_listeners()):
        # The outbox's receiver writes a paid recap's render row (recaps/signals.py).
        messages.append(
            checks.Error(
                "Nothing receives recaps.signals.recap_paid (or recap_payment_withdrawn): "
                "paid recaps would never be rendered (or a failed payment never withdrawn).",
                hint="Install the outbox app (INSTALLED_APPS 'outbox').",
                id="recaps.E002",
            )
        )
    return messages
