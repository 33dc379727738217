"""Settings for the `process_inbox` processes of tests/ingress/test_inbox_worker_deaths.py:
the project's settings plus this app (its handlers and its wrapped verifier)."""

from eventdrop.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.ingress.worker_killer"]  # noqa: F405
