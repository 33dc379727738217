"""System checks for recaps: configuration the purchase path needs."""

from django.conf import settings
from django.core import checks

from recaps.signals import recap_paid, recap_payment_withdrawn


@checks.register()
def check_recap_configuration(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    if not settings.STRIPE_API_KEY:
        messages.append(
            checks.Warning(
                "STRIPE_API_KEY is not set: recap purchases answer 503.",
                hint="Set STRIPE_API_KEY (sk_live_… / sk_test_…).",
                id="recaps.W001",
            )
        )
    # The render service's settings are the dispatcher's: outbox.E004 / W001
    # (outbox/configuration.py), one list for the check and the refusal to run.
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
