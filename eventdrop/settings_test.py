"""Test settings: the normal settings with test secrets and fast hashing.

The database is the settings' own: DATABASE_URL, else the local PostgreSQL (`make test`
starts an embedded one when none answers; scripts/localdb.py). pytest-django creates its
test database beside it.
"""

import hashlib
import os

# Never read a developer's .env (eventdrop/settings.py): the suite runs on what it sets here.
# In os.environ, so every process a test starts inherits it (tests/support/processes.py too).
os.environ["PYTHON_DOTENV_DISABLED"] = "1"
os.environ.setdefault("DJANGO_DEBUG", "0")
os.environ.setdefault("DJANGO_SECRET_KEY", "test-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz")
os.environ.setdefault("STRIPE_WEBHOOK_SECRET", "whsec_test_stripe_secret")
os.environ.setdefault("GITHUB_WEBHOOK_SECRET", "It's a Secret to Everybody")
os.environ.setdefault("SLACK_SIGNING_SECRET", "8f742231b10e8888abcd99yyyzzz85a5")
os.environ.setdefault("RENDERER_WEBHOOK_SECRET", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
# A complete dispatcher configuration (outbox.E004 otherwise); tests that dispatch start a
# fake render service and point RENDER_SERVICE_URL at it. Port 9 (discard) refuses at once.
os.environ.setdefault("RENDER_SERVICE_URL", "http://127.0.0.1:9")
os.environ.setdefault("RENDER_CALLBACK_URL", "http://127.0.0.1:9/webhooks/renderer/")

from eventdrop.settings import *  # noqa: F403

ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False
Q_CLUSTER = {**Q_CLUSTER, "sync": True}  # noqa: F405

# Recaps and outbox: tests start their own fake render service and fake Stripe on ephemeral
# ports and override the URLs; a bulkhead of one runs dispatches inline (no threads), and
# the PostgreSQL concurrency tests raise it explicitly.
STRIPE_API_KEY = "sk_test_eventdrop"
RENDER_MAX_CONCURRENCY = 1

# The test databases are named after this checkout too (test_eventdrop_<6 hex>_gw0, …): two
# checkouts on one server, each running its suite, never drop each other's.
_CHECKOUT = hashlib.sha1(str(BASE_DIR).encode(), usedforsecurity=False).hexdigest()[:6]  # noqa: F405
DATABASES["default"]["TEST"] = {  # noqa: F405
    "NAME": f"test_{DATABASES['default']['NAME']}_{_CHECKOUT}"[:50]  # noqa: F405
}
