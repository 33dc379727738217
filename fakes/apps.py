import os

from django.apps import AppConfig
from django.conf import settings


class FakesConfig(AppConfig):
    # An app so that its management commands (run_fake_renderer, run_fake_stripe, demo) are
    # found; it has no models and registers no checks.
    name = "fakes"
    verbose_name = "Local fakes"

    def ready(self) -> None:
        # The demo's failing handler (fakes/failing.py): local only, never in production. Not
        # in a handlers.py, which ingress imports from every app, everywhere.
        if os.environ.get("EVENTDROP_DEMO_FAILING_HANDLER", "1" if settings.DEBUG else "") == "1":
            from fakes import failing  # noqa: F401  (registers it)
