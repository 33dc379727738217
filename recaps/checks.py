"""System checks for recaps: configuration the purchase and render paths need."""

from django.conf import settings
from django.core import checks


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
    for name in ("RENDER_SERVICE_URL", "RENDER_CALLBACK_URL"):
        if not getattr(settings, name):
            messages.append(
                checks.Warning(
                    f"{name} is not set: every render request fails permanently "
                    "(not_configured) and its recap is marked failed.",
                    hint=f"Set {name}; locally scripts/run-local.sh does.",
                    id="recaps.W002",
                )
            )
    if settings.RECAP_MIN_PHOTOS < 1:
        messages.append(checks.Error("RECAP_MIN_PHOTOS must be at least 1.", id="recaps.E001"))
    return messages
