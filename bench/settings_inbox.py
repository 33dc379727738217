"""Settings for bench/inbox_throughput.py's worker processes only: the test settings (their
test secrets in the environment, nothing read from .env) plus the `bench` app, whose
`bench/handlers.py` registers the benchmark's handler the way every app registers its own."""

from eventdrop.settings_test import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]  # noqa: F405
