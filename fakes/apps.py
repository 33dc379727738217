from django.apps import AppConfig


class FakesConfig(AppConfig):
    # An app so that its management commands (run_fake_renderer, run_fake_stripe, demo) are
    # found; it has no models and registers no checks.
    name = "fakes"
    verbose_name = "Local fakes"
