"""Settings, all from the environment (twelve-factor).

`DATABASE_URL` selects the database, always PostgreSQL; unset means the local one,
`postgres://postgres@127.0.0.1:5432/eventdrop` (the port is `LOCAL_POSTGRES_PORT`), where
`make run` and `make test` start an embedded PostgreSQL when none answers
(scripts/localdb.py), so that trying the project needs nothing installed. Production
(DJANGO_DEBUG unset/false) refuses to start without a real `DJANGO_SECRET_KEY` of at least
SECRET_KEY_MIN_LENGTH characters.

A `.env` file at the top of the checkout (written by `make run` on first use, documented in
`.env.example`) is read first, so every `manage.py` command in any shell sees the same local
configuration. Real environment variables always win over it. `PYTHON_DOTENV_DISABLED=1`
(python-dotenv's own switch) skips the file: the test settings and the processes the tests
start set it, so a developer's `.env` never changes what the suite runs.
"""

import json
import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from dotenv import load_dotenv

BASE_DIR = Path(__file__).resolve().parent.parent

# override=False: a variable already in the environment is never replaced by the file's.
load_dotenv(BASE_DIR / ".env", override=False)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {value!r}") from exc


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {value!r}") from exc


def env_json_object(name: str) -> dict:
    value = os.environ.get(name, "").strip()
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a JSON object, got {value!r}") from exc
    if not isinstance(parsed, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object, got {value!r}")
    return parsed


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DJANGO_DEBUG")

_INSECURE_KEY = "django-insecure-local-development-only"
# Django's own deploy check (security.W009) asks for 50 characters: one number for both.
SECRET_KEY_MIN_LENGTH = 50
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            f"DJANGO_SECRET_KEY is not set. Set it ({SECRET_KEY_MIN_LENGTH}+ random "
            "characters), or run `make run` once: it writes a local .env with one."
        )
    SECRET_KEY = _INSECURE_KEY
elif not DEBUG and (SECRET_KEY == _INSECURE_KEY or len(SECRET_KEY) < SECRET_KEY_MIN_LENGTH):
    raise ImproperlyConfigured(
        f"DJANGO_SECRET_KEY is a development key or shorter than {SECRET_KEY_MIN_LENGTH} "
        "characters."
    )

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost" if DEBUG else "")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "knox",
    "django_q",
    "kernel",
    "eventdrop",
    "ingress",
    "recaps",
    "outbox",
    "console",
    "fakes",
    "regions",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Read-only screens read from the replica when there is one (kernel/routers.py).
    "kernel.routers.ReplicaReadsMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "eventdrop.urls"
WSGI_APPLICATION = "eventdrop.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Between the processes and PostgreSQL there may be PgBouncer in transaction pooling mode
# (DATABASE_POOLER=pgbouncer; kernel/db/postgresql/base.py, docs/scaling.md). Then no
# session state survives a transaction: statement_timeout is the database's default (set by
# `manage.py database_timeouts`, checked on every new connection), server-side cursors are
# off, and every advisory lock is transaction-scoped (ingress/partitions.py).
DATABASE_POOLER = os.environ.get("DATABASE_POOLER", "").strip().lower()
if DATABASE_POOLER not in {"", "pgbouncer"}:
    raise ImproperlyConfigured(
        f"DATABASE_POOLER must be empty or pgbouncer, got {DATABASE_POOLER!r}"
    )


def _database(url: str) -> dict[str, Any]:
    parsed = dj_database_url.parse(
        url,
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
        # Django checks a persistent connection once per request before its first query. On
        # PostgreSQL our backend's check is a poll(2) of the idle socket, not a `SELECT 1`:
        # no round trip on the webhook path, yet a connection the server hung up on (a
        # restart) is replaced before use instead of failing one request each.
        conn_health_checks=True,
    )
    # A plain dict: OPTIONS gains keys that dj_database_url's DBConfig does not declare.
    database: dict[str, Any] = dict(parsed)
    if database["ENGINE"] != "django.db.backends.postgresql":
        return database
    # A statement that hangs must not hold a web worker past the provider's patience:
    # connect fast or fail into a 503, and cap every statement. statement_timeout is the
    # server's own cap; a frozen server enforces nothing, so kernel.db.postgresql also
    # bounds every wait on our side (client_wait_timeout: the server's cap plus a margin for
    # its cancel to arrive first). Keepalives and tcp_user_timeout end a connection across a
    # real network partition (they do not fire for a frozen server, whose kernel still ACKs).
    statement_timeout_ms = env_int("DATABASE_STATEMENT_TIMEOUT_MS", 15000)
    database["ENGINE"] = "kernel.db.postgresql"
    database.setdefault("OPTIONS", {}).update(
        {
            "connect_timeout": env_int("DATABASE_CONNECT_TIMEOUT", 3),
            # Sent as a startup setting on a direct connection; behind the pooler it is what
            # every connection checks the server's default against instead.
            "options": f"-c statement_timeout={statement_timeout_ms}",
            "client_wait_timeout": statement_timeout_ms / 1000
            + env_float("DATABASE_CLIENT_WAIT_MARGIN_SECONDS", 5.0),
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": statement_timeout_ms + 5000,
        }
    )
    # The values are sent apart from the SQL (server-side binding), so the server can keep a
    # statement it has parsed and planned: psycopg prepares one on its 5th execution in a
    # connection (DATABASE_PREPARE_THRESHOLD; 0 binds on the client, as Django's default
    # does). The inbox drain runs the same few statements per batch and the same handler
    # statements per event: measured 1.2 x the events/s, PostgreSQL's CPU per event a third
    # less (docs/benchmarks.md). PgBouncer 1.18 (Debian's) cannot carry a prepared statement
    # across transactions, so behind the pooler the client binds, as before.
    prepare_threshold = env_int("DATABASE_PREPARE_THRESHOLD", 5)
    if prepare_threshold > 0 and not DATABASE_POOLER:
        database["OPTIONS"]["server_side_binding"] = True
        database["OPTIONS"]["prepare_threshold"] = prepare_threshold
    if DATABASE_POOLER:
        database["OPTIONS"]["pooler"] = DATABASE_POOLER
        # A server-side cursor (QuerySet.iterator()) lives in one server session across
        # transactions; PgBouncer hands that session to another client after each one.
        database["DISABLE_SERVER_SIDE_CURSORS"] = True
    return database


# A process may connect as its kind's own role (`manage.py db_roles`, docs/security.md):
# EVENTDROP_PROCESS=web reads DATABASE_URL_WEB, and so on; without one, DATABASE_URL. The
# kind also decides which checks of outbound configuration stop it (kernel/process_kinds.py).
PROCESS_KIND = os.environ.get("EVENTDROP_PROCESS", "").strip().lower()
PROCESS_DATABASE_URL = (
    os.environ.get(f"DATABASE_URL_{PROCESS_KIND.upper()}", "") if PROCESS_KIND else ""
)
# Unset, the local PostgreSQL: the one on 127.0.0.1:LOCAL_POSTGRES_PORT, or the embedded one
# that `make run` and `make test` start there when none answers (scripts/localdb.py).
LOCAL_DATABASE_URL = (
    f"postgres://postgres@127.0.0.1:{env_int('LOCAL_POSTGRES_PORT', 5432)}/eventdrop"
)
DATABASES = {
    "default": _database(
        PROCESS_DATABASE_URL or os.environ.get("DATABASE_URL") or LOCAL_DATABASE_URL
    )
}
# A streaming replica for what only reads (kernel/routers.py decides what may): the
# console's lists and searches, the ops page, /metrics, the API's list endpoints. It is
# skipped for a read while it is unreachable or more than DATABASE_REPLICA_MAX_LAG_SECONDS
# behind. Tests mirror it to the primary (one test database).
DATABASE_REPLICA_URL = os.environ.get("DATABASE_REPLICA_URL", "")
DATABASE_REPLICA_MAX_LAG_SECONDS = env_float("DATABASE_REPLICA_MAX_LAG_SECONDS", 30.0)
if DATABASE_REPLICA_URL:
    DATABASES["replica"] = {**_database(DATABASE_REPLICA_URL), "TEST": {"MIRROR": "default"}}
DATABASE_ROUTERS = ["kernel.routers.ReplicaRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

# --- Serving security (docs/security.md; `manage.py check --deploy` is clean in production,
# tests/eventdrop/test_deploy_check.py). The web process binds 127.0.0.1 and sits behind a
# TLS-terminating proxy or load balancer, which says `X-Forwarded-Proto: https` (and must
# overwrite whatever a client sent in that header).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# HSTS for this host, a year by default (sent on HTTPS responses only). Covering every
# subdomain, or asking to be preloaded into browsers, is a decision about the whole domain
# that is hard to take back: both are opt-in, and their deploy-check reminders (W005, W021)
# are silenced until an operator opts in.
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD")
# Off by default: the proxy in front redirects browsers to HTTPS. Django redirecting would
# answer a webhook POSTed over plain HTTP (an internal callback, a health check through the
# load balancer) with a 301 that providers do not follow — the event would be lost, not
# upgraded. Set it where the app faces the internet itself (W008 is silenced while it is off).
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT")
SILENCED_SYSTEM_CHECKS = [
    *([] if SECURE_HSTS_INCLUDE_SUBDOMAINS else ["security.W005"]),
    *([] if SECURE_HSTS_PRELOAD else ["security.W021"]),
    *([] if SECURE_SSL_REDIRECT else ["security.W008"]),
]
# Database roles per process kind (`manage.py db_roles`, kernel/db_roles.py): named
# <prefix><kind>. Handlers run as the role of the process that runs them (inbox, worker),
# which holds their writes; no role can switch to another.
DATABASE_ROLE_PREFIX = os.environ.get("DATABASE_ROLE_PREFIX", "eventdrop_")
# On: the deployment's processes connect as those roles, and the release phase keeps them up
# to date after migrate and region_setup (`db_roles --release`, the Procfile).
DATABASE_ROLES_MANAGED = env_bool("DATABASE_ROLES_MANAGED")

LOGIN_URL = "/admin/login/"

# Scripts use expiring tokens (stored hashed; `manage.py api_token`), browsers the admin
# session with its CSRF check; no HTTP Basic, which browsers replay on cross-site requests.
# Token first: bad or missing credentials are a 401 with `WWW-Authenticate: Token`.
# JSON is the only body a write accepts (a form post from another site is a 415).
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    # Every error as RFC 9457 problem details, 500s included; the database being down is a
    # 503 with Retry-After (kernel/problems.py).
    "EXCEPTION_HANDLER": "kernel.problems.problem_exception_handler",
    # The OpenAPI schema of the console API (GET /api/schema/, docs/openapi.json).
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "EventDrop console API",
    "DESCRIPTION": "Reads and operator actions of the replay and re-arm console (docs/console.md).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The console API only: the buyer API and the webhook path are documented in docs/.
    "SCHEMA_PATH_PREFIX": "/api/",
    "PREPROCESSING_HOOKS": ["console.api.console_endpoints_only"],
    "POSTPROCESSING_HOOKS": ["console.api.problem_responses"],
}
# Days a token from `manage.py api_token issue` lives unless --ttl-days says otherwise.
API_TOKEN_TTL_DAYS = env_int("API_TOKEN_TTL_DAYS", 90)

# Every line goes through one handler and its two filters (kernel/logformat.py): search
# terms are redacted from URLs, and a repeated failure is one traceback, then one line per
# LOG_REPEAT_INTERVAL_SECONDS with the count of the ones suppressed. Django's own loggers
# (django.request's 4xx/5xx lines, runserver's request lines) are sent to it too, instead
# of to the handlers Django installs by default, which would bypass both filters.
LOG_REPEAT_INTERVAL_SECONDS = env_float("LOG_REPEAT_INTERVAL_SECONDS", 60.0)
# LOG_FORMAT=json: one JSON object per line for a log shipper, the same fields as the
# default key=value line (kernel.logformat.JsonFormatter); both pass the same filters.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "plain").strip().lower() or "plain"
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be plain or json, got {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {
            "()": "kernel.logformat.KeyValueFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {
            "()": "kernel.logformat.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
    },
    "filters": {
        "redact_search_terms": {"()": "kernel.logformat.RedactSearchTerms"},
        "repeated_incidents": {
            "()": "kernel.logformat.RepeatedIncidentFilter",
            "interval_seconds": LOG_REPEAT_INTERVAL_SECONDS,
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["redact_search_terms", "repeated_incidents"],
        }
    },
    "loggers": {
        "django": {"handlers": [], "propagate": True},
        "django.server": {"handlers": [], "propagate": True},
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

# --- Webhook sources -----------------------------------------------------------------------
# Secrets come only from the environment; several secrets are comma-separated (rotation).
# Extra sources (e.g. a generic HMAC sender) can be declared as JSON in WEBHOOK_EXTRA_SOURCES:
#   {"acme": {"provider": "hmac", "secrets_env": "ACME_WEBHOOK_SECRET",
#             "signature_header": "X-Acme-Signature", "signature_prefix": "sha256="}}
# See ingress/sources.py for every per-source option.
WEBHOOK_SOURCES = {
    "stripe": {"provider": "stripe", "secrets_env": "STRIPE_WEBHOOK_SECRET"},
    "github": {"provider": "github", "secrets_env": "GITHUB_WEBHOOK_SECRET"},
    "slack": {"provider": "slack", "secrets_env": "SLACK_SIGNING_SECRET"},
    "renderer": {"provider": "standard", "secrets_env": "RENDERER_WEBHOOK_SECRET"},
}
WEBHOOK_EXTRA_SOURCES = os.environ.get("WEBHOOK_EXTRA_SOURCES", "")
WEBHOOK_DEFAULT_MAX_BODY_BYTES = env_int("WEBHOOK_MAX_BODY_BYTES", 1024 * 1024)
WEBHOOK_DEFAULT_TOLERANCE_SECONDS = env_int("WEBHOOK_TOLERANCE_SECONDS", 300)
# Raw events are kept this long (daily partitions on PostgreSQL); rejected ones shorter.
RAW_EVENT_RETENTION_DAYS = env_int("RAW_EVENT_RETENTION_DAYS", 90)
# Rejected events (never verified) are only forensics: deleted sooner (ingress/partitions.py).
RAW_EVENT_REJECTED_RETENTION_DAYS = env_int("RAW_EVENT_REJECTED_RETENTION_DAYS", 30)
RAW_EVENT_PARTITIONS_AHEAD_DAYS = env_int("RAW_EVENT_PARTITIONS_AHEAD_DAYS", 7)
# Bodies encrypted at rest (ingress/encryption.py): comma-separated Fernet keys, the first
# encrypts, all decrypt (rotation: prepend the new key, run rotate_raw_event_keys, drop the
# old one). Empty: bodies are stored as received.
RAW_EVENT_ENCRYPTION_KEYS = env_list("RAW_EVENT_ENCRYPTION_KEYS")
# Archive before drop (ingress/archive.py): off unless RAW_EVENT_ARCHIVE_ENABLED=1. Each day's
# events go to S3-compatible storage (django-storages + boto3) before its partition is
# dropped, and the drop waits for the archive to be read back and verified. Credentials come
# from boto3's own chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a profile, a role);
# ingress.E005 checks the rest.
RAW_EVENT_ARCHIVE_ENABLED = env_bool("RAW_EVENT_ARCHIVE_ENABLED")
RAW_EVENT_ARCHIVE_BUCKET = os.environ.get("RAW_EVENT_ARCHIVE_BUCKET", "").strip()
RAW_EVENT_ARCHIVE_PREFIX = os.environ.get("RAW_EVENT_ARCHIVE_PREFIX", "raw-events").strip("/ ")
AWS_S3_ENDPOINT_URL = os.environ.get("AWS_S3_ENDPOINT_URL", "").strip() or None
AWS_S3_REGION_NAME = os.environ.get("AWS_S3_REGION_NAME", "").strip() or None
# Every S3 call: connect and read timeouts, and attempts in all (botocore's standard retry
# mode); kernel/budgets.py holds their worst case against RAW_EVENT_PARTITIONS_BUDGET_SECONDS.
# Defaults: 2 x (2 s + 5 s) + 6 s = 20 s a call, 10 calls a day with four sources: 200 s.
RAW_EVENT_ARCHIVE_CONNECT_TIMEOUT_SECONDS = env_float(
    "RAW_EVENT_ARCHIVE_CONNECT_TIMEOUT_SECONDS", 2.0
)
RAW_EVENT_ARCHIVE_READ_TIMEOUT_SECONDS = env_float("RAW_EVENT_ARCHIVE_READ_TIMEOUT_SECONDS", 5.0)
RAW_EVENT_ARCHIVE_MAX_ATTEMPTS = env_int("RAW_EVENT_ARCHIVE_MAX_ATTEMPTS", 2)
# Time one maintenance run may spend; below Q_TIMEOUT, which kills the scheduled task.
RAW_EVENT_PARTITIONS_BUDGET_SECONDS = env_float("RAW_EVENT_PARTITIONS_BUDGET_SECONDS", 240.0)
# Restored events stay this long after their restore, then go with their partition again.
RAW_EVENT_RESTORED_RETENTION_DAYS = env_int("RAW_EVENT_RESTORED_RETENTION_DAYS", 7)
# Seconds a provider is told to wait before retrying when the database is unavailable.
INGRESS_UNAVAILABLE_RETRY_AFTER = env_int("INGRESS_UNAVAILABLE_RETRY_AFTER", 10)
# The webhook route's time budget (what the load balancer / platform allows a request).
WEBHOOK_REQUEST_BUDGET_SECONDS = env_float("WEBHOOK_REQUEST_BUDGET_SECONDS", 30.0)
# The whole request body must arrive within this (ingress/asgi.py answers 408 after it).
WEBHOOK_BODY_READ_TIMEOUT_SECONDS = env_float("WEBHOOK_BODY_READ_TIMEOUT_SECONDS", 5.0)
# One deadline for storing a webhook (ingress/services.py): connecting if needed, the INSERT,
# and one reconnect after a dead connection all end within it, or the answer is a 503.
WEBHOOK_STORE_TIMEOUT_SECONDS = env_float("WEBHOOK_STORE_TIMEOUT_SECONDS", 5.0)

# --- Inbox worker (verify, dedup, deliver; ingress/inbox.py) ------------------------------
# 500, not 200: ~9-12 % less worker and PostgreSQL CPU per event (fewer claims and commits),
# which the drain needs to keep up with the ingress (docs/benchmarks.md); a batch's
# transaction, its row locks and the handlers run in it last about 2.5 x as long (~0.5 s).
INBOX_BATCH_SIZE = env_int("INBOX_BATCH_SIZE", 500)
INBOX_IDLE_SLEEP_SECONDS = env_float("INBOX_IDLE_SLEEP_SECONDS", 0.5)
# A claim of raw events also stops at this many body bytes (always at least one row), so a
# flood of large bodies cannot take the worker's memory: a batch holds at most the larger of
# this and the largest source's max_body_bytes (ingress.W012; docs/architecture.md).
INBOX_BATCH_BYTES = env_int("INBOX_BATCH_BYTES", 32 * 1024 * 1024)
# Claimed raw events are the claim's until settled or given back (a worker that is alive
# gives back what it could not settle); those of a worker that died are claimed again after
# this long. Longer than the worker's error backoff (30 s), so that a worker whose database
# went away gets to give its claims back before another worker takes them (ingress.W012).
INBOX_CLAIM_LEASE_SECONDS = env_float("INBOX_CLAIM_LEASE_SECONDS", 60.0)
# The one queue (kernel/queue.py, docs/queue.md): a claim is its holder's while the holder
# beats (at every claim, and every CLAIM_HOLDER_BEAT_SECONDS while it waits on calls); a
# holder silent for CLAIM_HOLDER_TTL_SECONDS is gone, and its claims are worked again.
# Longer than the worker loop's longest error pause (30 s) and a beat, so that a worker whose
# database went away gives its claims back itself (kernel.E001).
CLAIM_HOLDER_BEAT_SECONDS = env_float("CLAIM_HOLDER_BEAT_SECONDS", 5.0)
CLAIM_HOLDER_TTL_SECONDS = env_float("CLAIM_HOLDER_TTL_SECONDS", 45.0)
# A raw event or a delivery whose worker died this many times in a row with it — every time
# but the first alone in its batch — is set aside `worker_died` (ingress/inbox.py,
# ingress/deliveries/). At least 2: one death in a batch says nothing about one row.
INBOX_MAX_WORKER_DEATHS = env_int("INBOX_MAX_WORKER_DEATHS", 3)
# A raw event whose settling raises is retried after 30 s, 60 s, 120 s, … and set aside
# (rejected `processing_failed`, re-verifiable) after this many failures.
INBOX_MAX_ROW_FAILURES = env_int("INBOX_MAX_ROW_FAILURES", 5)
INBOX_ROW_RETRY_BASE_SECONDS = env_float("INBOX_ROW_RETRY_BASE_SECONDS", 30.0)
# Payload bytes (body and headers) kept per source and minute of arrival from requests that
# fail verification; past it their payload is dropped, their row kept (ingress/
# rejected_payloads.py; the figure's reasoning in docs/security.md).
INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE = env_int(
    "INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE", 1024 * 1024
)
DELIVERY_MAX_ATTEMPTS = env_int("DELIVERY_MAX_ATTEMPTS", 8)
DELIVERY_BACKOFF_BASE_SECONDS = env_float("DELIVERY_BACKOFF_BASE_SECONDS", 5.0)
DELIVERY_BACKOFF_CAP_SECONDS = env_float("DELIVERY_BACKOFF_CAP_SECONDS", 3600.0)
# A handler's own failure keeps its delivery alive at least this long after the first
# charged one (the last attempt waits for it): Stripe itself retries for three days.
DELIVERY_TRANSIENT_HORIZON_SECONDS = env_float("DELIVERY_TRANSIENT_HORIZON_SECONDS", 259200.0)
# A delivery `processing` longer than this, and not locked by a live batch, belonged to a
# worker that died: re-arm it. Above INBOX_BATCH_SIZE x the statement timeout (ingress.W011):
# 500 x 15 s = 7500 s.
DELIVERY_STALE_AFTER_SECONDS = env_int("DELIVERY_STALE_AFTER_SECONDS", 9000)
# Time a scheduled (django-q2) inbox pass may use before it yields; below Q_TIMEOUT.
INBOX_SCHEDULED_PASS_BUDGET_SECONDS = env_float("INBOX_SCHEDULED_PASS_BUDGET_SECONDS", 50.0)

# Two or more regions, active-active on PostgreSQL logical replication (docs/multi-region.md).
# Empty EVENTDROP_REGION: one region, nothing replicated. The number is the high bits of every
# id this region hands out; it differs between regions. Peers: `name=postgres://…` with `;`
# between several, the URL each subscription connects with.
EVENTDROP_REGION = os.environ.get("EVENTDROP_REGION", "").strip()
EVENTDROP_REGION_NUMBER = env_int("EVENTDROP_REGION_NUMBER", 0)
EVENTDROP_REGION_PEERS = os.environ.get("EVENTDROP_REGION_PEERS", "").strip()
EVENTDROP_REGION_PEER_FRESH_SECONDS = env_float("EVENTDROP_REGION_PEER_FRESH_SECONDS", 30.0)
EVENTDROP_REGION_LEASE_SECONDS = env_float("EVENTDROP_REGION_LEASE_SECONDS", 30.0)

# Resuming a paused handler releases its held deliveries at this rate, in received order
# (ingress.deliveries.deliveries_release): well under what one inbox worker drains
# (docs/benchmarks.md, "Inbox drain"), so a resumed backlog runs beside the live traffic
# instead of ahead of it, and the downstream that was the reason for the pause is not hit
# with the whole backlog at once. 10,000 held deliveries take 100 s.
INBOX_RESUME_RELEASE_PER_SECOND = env_float("INBOX_RESUME_RELEASE_PER_SECOND", 100.0)

# --- django-q2 -----------------------------------------------------------------------------
# The ORM broker (default) keeps everything in the one database; `retry` must exceed
# `timeout` so a task is never handed to a second worker while the first may still run it.
# Q_BROKER=redis moves the queue to Redis (REDIS_URL) and off PostgreSQL's hot tables. Either
# way a task is only a nudge: every task here claims its work from rows (raw events,
# deliveries, side effects) with SKIP LOCKED, so a message lost with a Redis restart, or
# popped by a cluster that is then killed (Redis has no acknowledgement), loses no work — the
# rows stay pending and the next tick, or the long-running inbox and dispatcher, take them.
# Schedules live in the database whatever the broker: each cluster's scheduler advances a due
# schedule under SELECT … FOR UPDATE, so of several clusters one enqueues each tick.
Q_BROKER = os.environ.get("Q_BROKER", "orm").strip().lower()
REDIS_URL = os.environ.get("REDIS_URL", "")
Q_CLUSTER = {
    "name": "eventdrop",
    "workers": env_int("Q_WORKERS", 2),
    "timeout": env_int("Q_TIMEOUT", 300),
    "retry": env_int("Q_RETRY", 360),
    "max_attempts": 1,
    "catch_up": False,
    "poll": 1,
    "save_limit": 500,
    "ack_failures": True,
}
if Q_BROKER == "orm":
    Q_CLUSTER["orm"] = "default"
elif Q_BROKER == "redis":
    if not REDIS_URL:
        raise ImproperlyConfigured("Q_BROKER=redis needs REDIS_URL (redis://host:6379/0)")
    from redis.connection import parse_url

    Q_CLUSTER["redis"] = {
        **parse_url(REDIS_URL),
        # Client-side bounds on every Redis call: connecting, and every reply. A dequeue is a
        # BLPOP of 1 s (django-q2), well inside the read bound.
        "socket_connect_timeout": env_float("REDIS_CONNECT_TIMEOUT_SECONDS", 2.0),
        "socket_timeout": env_float("REDIS_SOCKET_TIMEOUT_SECONDS", 5.0),
        "socket_keepalive": True,
        "health_check_interval": 30,
    }
else:
    raise ImproperlyConfigured(f"Q_BROKER must be orm or redis, got {Q_BROKER!r}")

# --- Recaps, render service and outbox (see recaps/ and outbox/) ---------------------------
# Every duration below is in seconds. kernel/budgets.py turns them into worst cases, and the
# `outbox.E001` system check refuses to start when one exceeds the budget of a caller.

# Stripe (recap purchase). The SDK's HTTP client gets explicit (connect, read) timeouts and
# a bounded number of its own retries; both count in the purchase request's budget.
STRIPE_API_KEY = os.environ.get("STRIPE_API_KEY", "")
STRIPE_API_BASE = os.environ.get("STRIPE_API_BASE", "https://api.stripe.com")
STRIPE_CONNECT_TIMEOUT_SECONDS = env_float("STRIPE_CONNECT_TIMEOUT_SECONDS", 2.0)
STRIPE_READ_TIMEOUT_SECONDS = env_float("STRIPE_READ_TIMEOUT_SECONDS", 4.0)
STRIPE_MAX_NETWORK_RETRIES = env_int("STRIPE_MAX_NETWORK_RETRIES", 1)
# What a buyer waits for the checkout redirect (the purchase API request).
RECAP_PURCHASE_BUDGET_SECONDS = env_float("RECAP_PURCHASE_BUDGET_SECONDS", 15.0)
RECAP_PRICE_CENTS = env_int("RECAP_PRICE_CENTS", 990)
RECAP_CURRENCY = os.environ.get("RECAP_CURRENCY", "eur")
# {recap_id} is replaced; Stripe adds nothing else to these.
RECAP_CHECKOUT_SUCCESS_URL = os.environ.get(
    "RECAP_CHECKOUT_SUCCESS_URL", "http://127.0.0.1:8000/recaps/{recap_id}/?checkout=success"
)
RECAP_CHECKOUT_CANCEL_URL = os.environ.get(
    "RECAP_CHECKOUT_CANCEL_URL", "http://127.0.0.1:8000/recaps/{recap_id}/?checkout=cancel"
)
# A recap of fewer photos cannot be cut; the render is refused as a permanent error.
RECAP_MIN_PHOTOS = env_int("RECAP_MIN_PHOTOS", 5)

# Render service. Each call has a connect timeout, a read timeout (silence between bytes)
# and a total deadline (caps a slow drip); the health precheck is one call, the render
# request may be tried RENDER_CALL_ATTEMPTS times within one dispatch (1 = the outbox is the
# only retry loop, which is the point of having one).
RENDER_SERVICE_URL = os.environ.get("RENDER_SERVICE_URL", "")
RENDER_CALLBACK_URL = os.environ.get("RENDER_CALLBACK_URL", "")
RENDER_WEBHOOK_SOURCE = os.environ.get("RENDER_WEBHOOK_SOURCE", "renderer")
RENDER_HEALTH_CONNECT_TIMEOUT_SECONDS = env_float("RENDER_HEALTH_CONNECT_TIMEOUT_SECONDS", 1.0)
RENDER_HEALTH_READ_TIMEOUT_SECONDS = env_float("RENDER_HEALTH_READ_TIMEOUT_SECONDS", 2.0)
RENDER_HEALTH_TIMEOUT_SECONDS = env_float("RENDER_HEALTH_TIMEOUT_SECONDS", 3.0)
RENDER_CONNECT_TIMEOUT_SECONDS = env_float("RENDER_CONNECT_TIMEOUT_SECONDS", 2.0)
RENDER_READ_TIMEOUT_SECONDS = env_float("RENDER_READ_TIMEOUT_SECONDS", 8.0)
RENDER_TIMEOUT_SECONDS = env_float("RENDER_TIMEOUT_SECONDS", 10.0)
RENDER_CALL_ATTEMPTS = env_int("RENDER_CALL_ATTEMPTS", 1)
RENDER_CALL_BACKOFF_BASE_SECONDS = env_float("RENDER_CALL_BACKOFF_BASE_SECONDS", 2.0)
RENDER_CALL_BACKOFF_CAP_SECONDS = env_float("RENDER_CALL_BACKOFF_CAP_SECONDS", 8.0)
# Bulkhead: render calls in flight at once, per dispatcher process.
RENDER_MAX_CONCURRENCY = env_int("RENDER_MAX_CONCURRENCY", 4)
# Circuit breaker (state in the database, shared by every worker process and host).
RENDER_BREAKER_FAILURE_THRESHOLD = env_int("RENDER_BREAKER_FAILURE_THRESHOLD", 5)
RENDER_BREAKER_COOLDOWN_SECONDS = env_float("RENDER_BREAKER_COOLDOWN_SECONDS", 60.0)
# Each dispatcher reads the shared breaker at most this often (it is off the per-row path),
# and a breaker write waits at most this long for the row's lock before it is dropped.
RENDER_BREAKER_REFRESH_MS = env_int("RENDER_BREAKER_REFRESH_MS", 500)
RENDER_BREAKER_LOCK_TIMEOUT_MS = env_int("RENDER_BREAKER_LOCK_TIMEOUT_MS", 200)

# Outbox (recap_side_effects).
OUTBOX_DISPATCH_BUDGET_SECONDS = env_float("OUTBOX_DISPATCH_BUDGET_SECONDS", 60.0)
OUTBOX_MAX_ATTEMPTS = env_int("OUTBOX_MAX_ATTEMPTS", 5)
# A transient failure keeps a row alive at least this long after its first charged failure
# (the last attempt waits for it); Stripe itself retries for three days.
OUTBOX_TRANSIENT_HORIZON_SECONDS = env_float("OUTBOX_TRANSIENT_HORIZON_SECONDS", 86400.0)
OUTBOX_BACKOFF_BASE_SECONDS = env_float("OUTBOX_BACKOFF_BASE_SECONDS", 60.0)
OUTBOX_BACKOFF_CAP_SECONDS = env_float("OUTBOX_BACKOFF_CAP_SECONDS", 1800.0)
# A row `processing` longer than this belonged to a dispatcher that died: re-arm it.
OUTBOX_STALE_PROCESSING_SECONDS = env_int("OUTBOX_STALE_PROCESSING_SECONDS", 900)
# `manage.py dispatch_side_effects` without --once: pause between runs.
OUTBOX_IDLE_SLEEP_SECONDS = env_float("OUTBOX_IDLE_SLEEP_SECONDS", 5.0)
# Nightly recovery counts recaps `rendering` longer than this (a lost completion callback).
RECAP_STUCK_RENDERING_HOURS = env_int("RECAP_STUCK_RENDERING_HOURS", 24)
# A recap `rendering` whose completion callback has not arrived by rendering_at + expected
# time + margin is asked about again (GET /renders/<id>; outbox/render_status.py), then
# every RENDER_CHECK_INTERVAL_SECONDS while the service says it is still rendering or cannot
# answer. The margin covers the service's own callback retries and our inbox's lag.
RENDER_EXPECTED_SECONDS = env_float("RENDER_EXPECTED_SECONDS", 900.0)
RENDER_CALLBACK_MARGIN_SECONDS = env_float("RENDER_CALLBACK_MARGIN_SECONDS", 600.0)
RENDER_CHECK_INTERVAL_SECONDS = env_float("RENDER_CHECK_INTERVAL_SECONDS", 300.0)
# The status call (same three limits as every render-service call) and the budget of one
# check run, which the dispatcher task and the nightly recovery each spend after their work.
RENDER_STATUS_CONNECT_TIMEOUT_SECONDS = env_float("RENDER_STATUS_CONNECT_TIMEOUT_SECONDS", 1.0)
RENDER_STATUS_READ_TIMEOUT_SECONDS = env_float("RENDER_STATUS_READ_TIMEOUT_SECONDS", 2.0)
RENDER_STATUS_TIMEOUT_SECONDS = env_float("RENDER_STATUS_TIMEOUT_SECONDS", 3.0)
RENDER_CHECK_BUDGET_SECONDS = env_float("RENDER_CHECK_BUDGET_SECONDS", 20.0)
RENDER_CHECK_BATCH_SIZE = env_int("RENDER_CHECK_BATCH_SIZE", 50)

# --- Operations page and metrics -----------------------------------------------------------
# /ops/ and /metrics need the console.view_ops permission (console/ops/views.py). Prometheus
# authenticates with `Authorization: Bearer <METRICS_BEARER_TOKEN>`; unset, /metrics answers
# only signed-in staff with the permission. With several web worker processes also set
# PROMETHEUS_MULTIPROC_DIR (read by prometheus_client itself; see docs/console.md).
METRICS_BEARER_TOKEN = os.environ.get("METRICS_BEARER_TOKEN", "")

# --- Traces (kernel/tracing.py, docs/tracing.md) --------------------------------------------
# Turned on by the standard OTEL_* variables alone, read by the OpenTelemetry SDK. The
# console's raw event, delivery and recap pages link to a row's trace at this URL, its
# `{trace_id}` replaced (e.g. http://jaeger:16686/trace/{trace_id}); unset, they show the id.
TRACE_URL_TEMPLATE = os.environ.get("TRACE_URL_TEMPLATE", "")

# --- Reconciliation (ingress/reconcile/, docs/reconciliation.md) ---------------------------
# Nightly runs compare the providers' own lists with the dedup index and record the drift.
# The seed's SLO: under 0.01 % of the events a provider lists may be missing.
RECONCILE_DRIFT_SLO = env_float("RECONCILE_DRIFT_SLO", 0.0001)
# Default window: from LOOKBACK_HOURS before its end (two nights, so one failed night is
# covered by the next) up to SETTLE_SECONDS ago (younger events may still be on their way).
RECONCILE_LOOKBACK_HOURS = env_int("RECONCILE_LOOKBACK_HOURS", 48)
RECONCILE_SETTLE_SECONDS = env_int("RECONCILE_SETTLE_SECONDS", 600)
# Bounds of one run: pages listed, and wall-clock time (a call is only started while what
# is left covers its worst case; below Q_TIMEOUT for the nightly task).
RECONCILE_MAX_PAGES = env_int("RECONCILE_MAX_PAGES", 200)
RECONCILE_RUN_BUDGET_SECONDS = env_float("RECONCILE_RUN_BUDGET_SECONDS", 240.0)
# Stripe event types the webhook endpoint receives (at most 20); empty: those our Stripe
# handlers are registered for. Stripe is reached with STRIPE_API_KEY / STRIPE_API_BASE.
RECONCILE_STRIPE_EVENT_TYPES = env_list("RECONCILE_STRIPE_EVENT_TYPES")
# GitHub hooks for the nightly run: `owner/repo:HOOK_ID` or `org:HOOK_ID`, comma-separated.
RECONCILE_GITHUB_HOOKS = env_list("RECONCILE_GITHUB_HOOKS")
GITHUB_API_BASE = os.environ.get("GITHUB_API_BASE", "https://api.github.com")
GITHUB_API_TOKEN = os.environ.get("GITHUB_API_TOKEN", "")
GITHUB_CONNECT_TIMEOUT_SECONDS = env_float("GITHUB_CONNECT_TIMEOUT_SECONDS", 3.0)
GITHUB_READ_TIMEOUT_SECONDS = env_float("GITHUB_READ_TIMEOUT_SECONDS", 10.0)
GITHUB_MAX_RETRIES = env_int("GITHUB_MAX_RETRIES", 1)
# A repeated body-only signature (ingress/signature_replays.py) is answered from the delivery
# logs of RECONCILE_GITHUB_HOOKS (every 5 minutes, ingress/reconcile/signature_questions.py):
# a GUID GitHub lists is genuine; one it does not list is a replay only once the event is
# older than this (a delivery GitHub made a moment ago may not be listed yet).
SIGNATURE_QUESTION_LISTING_LAG_SECONDS = env_int("SIGNATURE_QUESTION_LISTING_LAG_SECONDS", 600)

# --- Bulk jobs and handler pauses (console/jobs/services.py, console/pauses/services.py) ---
# A bulk replay or re-arm runs on django-q2 in batches of BULK_JOB_BATCH_SIZE rows, each in
# one short transaction: nothing of the inbox waits longer than one batch. One task runs
# for at most BULK_JOB_TASK_BUDGET_SECONDS (well inside Q_TIMEOUT) and then enqueues its
# continuation; a job whose heartbeat is older than BULK_JOB_STALE_SECONDS (a worker died)
# is enqueued again by the minute sweep and resumes at its cursor.
BULK_JOB_BATCH_SIZE = env_int("BULK_JOB_BATCH_SIZE", 500)
BULK_JOB_TASK_BUDGET_SECONDS = env_float("BULK_JOB_TASK_BUDGET_SECONDS", 60.0)
BULK_JOB_STALE_SECONDS = env_int("BULK_JOB_STALE_SECONDS", 180)
# The seed's SLO: 99 % of the selected raw events replayed within 2 minutes of the click.
BULK_JOB_REPLAY_SLO_SECONDS = env_int("BULK_JOB_REPLAY_SLO_SECONDS", 120)
# A handler's limits (ingress/deliveries/pace.py) are declared with it (webhook_handler's
# rate, concurrency, replay_volume); this overrides them per environment, by handler name:
# '{"recaps.handlers.mark_recap_paid": {"rate": 20, "concurrency": 4}}' (null lifts one).
# manage.py check holds a rate to the replay SLO (ingress.E017/W017).
HANDLER_LIMITS = env_json_object("HANDLER_LIMITS")
# A rate's tokens saved up while a handler idles: this many seconds of its rate (at least 1).
HANDLER_RATE_BURST_SECONDS = env_float("HANDLER_RATE_BURST_SECONDS", 0.5)
# A downstream's 429 without Retry-After pauses the handler's claims this long; either way
# its rate is halved (down to 1/16) for HANDLER_SLOWDOWN_SECONDS after the pause.
HANDLER_RATE_LIMITED_PAUSE_SECONDS = env_float("HANDLER_RATE_LIMITED_PAUSE_SECONDS", 5.0)
HANDLER_SLOWDOWN_SECONDS = env_float("HANDLER_SLOWDOWN_SECONDS", 60.0)
# A paused handler shows yellow on the ops page from this age, red from the second.
HANDLER_PAUSE_YELLOW_SECONDS = env_int("HANDLER_PAUSE_YELLOW_SECONDS", 900)
HANDLER_PAUSE_RED_SECONDS = env_int("HANDLER_PAUSE_RED_SECONDS", 3600)
