"""Settings for the region processes of tests/regions/test_takeover_claims.py: the bench
handler's settings (bench/settings_inbox.py) plus the gated handler of
tests/ingress/worker_killer, which waits at an advisory lock the test holds."""

from bench.settings_inbox import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.ingress.worker_killer"]  # noqa: F405
# The production bulkhead (the test settings run one dispatch at a time): every side effect
# of the test is in flight at once.
RENDER_MAX_CONCURRENCY = 4
