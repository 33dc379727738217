"""Settings for the `process_inbox` processes of tests/ingress/test_fair_share_processes.py:
the project's settings plus this app (its handlers)."""

from eventdrop.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.ingress.paced"]  # noqa: F405
