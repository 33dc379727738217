"""Logs: search terms never reach them, and one incident is a bounded number of lines.

The unit tests drive kernel.logformat's filters through a real logger, handler and
formatter. The last test greps the log of a real run: the Procfile's web process and the
inbox worker against a throw-away PostgreSQL cluster, requests carrying markers in bodies,
headers, secrets, tokens and search terms, and a database outage in the middle.
"""

import io
import logging

import pytest

from kernel.logformat import (
    MAX_INCIDENT_KINDS,
    KeyValueFormatter,
    RedactSearchTerms,
    RepeatedIncidentFilter,
    redact_search_terms,
)

# --- redaction -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/admin/ingress/rawevent/?q=cs_live_1", "/admin/ingress/rawevent/?q=[redacted]"),
        (
            "/api/raw-events/?source=x&q=a+b&limit=5",
            "/api/raw-events/?source=x&q=[redacted]&limit=5",
        ),
        (
            "/api/raw-events/?body_contains=%22id%22#top",
            "/api/raw-events/?body_contains=[redacted]#top",
        ),
        ("q=secret", "q=[redacted]"),
        (
            "GET /admin/ingress/rawevent/3/change/?_changelist_filters=q%3Dneedle HTTP/1.1",
            "GET /admin/ingress/rawevent/3/change/?_changelist_filters=[redacted] HTTP/1.1",
        ),
        ("<WSGIRequest: GET '/api/?q=x'>", "<WSGIRequest: GET '/api/?q=[redacted]'>"),
        # A body's hash confirms a guessed body: a filter on one is a search.
        (
            "/admin/ingress/rawevent/?dedup_key=sha256%3Aab&body_sha256__startswith=cd&x=1",
            "/admin/ingress/rawevent/?dedup_key=[redacted]&body_sha256__startswith=[redacted]&x=1",
        ),
        # Not a search parameter: untouched.
        ("/admin/?faq=1&seq=2&source=q", "/admin/?faq=1&seq=2&source=q"),
        ("ingress.receive.store_failed", "ingress.receive.store_failed"),
    ],
)
def test_redact_search_terms(text, expected):
    assert redact_search_terms(text) == expected


def make_logger(name: str, *filters: logging.Filter) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(KeyValueFormatter("%(levelname)s %(name)s %(message)s"))
    for log_filter in filters:
        handler.addFilter(log_filter)
    logger = logging.getLogger(f"tests.logging.{name}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream


def test_redaction_covers_message_arguments_and_extras(rf):
    logger, stream = make_logger("redact", RedactSearchTerms())
    request = rf.get("/api/raw-events/", {"body_contains": "needle-1", "limit": "2"})
    logger.warning("Forbidden: %s", request.path, extra={"status_code": 403, "request": request})
    # An access log passes its atoms as a mapping.
    logger.info("%(r)s %(s)s", {"r": "GET /admin/?q=needle-2 HTTP/1.1", "s": "200"})
    logger.info('"%s" %s', "GET /admin/?q=needle-3 HTTP/1.1", 200)
    logger.info("search", extra={"url": "/api/raw-events/?q=needle-4"})
    output = stream.getvalue()
    assert "needle" not in output
    assert output.count("[redacted]") == 4
    assert (
        "request='<WSGIRequest: GET /api/raw-events/?body_contains=[redacted]&limit=2>'" in output
    )


# --- repeated incidents --------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def raise_and_log(logger: logging.Logger, event: str = "ingress.receive.store_failed", error=None):
    try:
        raise error or ConnectionError("connection refused")
    except Exception:
        logger.exception(event, extra={"source": "github"})


def test_an_incident_is_one_traceback_then_one_summary_per_interval():
    clock = Clock()
    logger, stream = make_logger("incident", RepeatedIncidentFilter(60, clock=clock))
    for _ in range(2239):  # the outage of the post-mortem, in one minute
        raise_and_log(logger)
        clock.now += 0.02
    first = stream.getvalue()
    assert first.count("Traceback") == 1 and first.count("store_failed") == 1

    clock.now += 60
    raise_and_log(logger)
    summary = stream.getvalue()[len(first) :]
    assert summary.count("\n") == 1 and "Traceback" not in summary
    assert "ingress.receive.store_failed" in summary
    assert "suppressed=2238" in summary and "exception='ConnectionError'" in summary

    # Quiet for a whole interval: the next one is a new incident, traceback included.
    clock.now += 61
    raise_and_log(logger)
    assert stream.getvalue().count("Traceback") == 2


@pytest.mark.parametrize(
    ("second", "separate"),
    [
        ({"event": "ingress.receive.store_failed"}, False),
        ({"event": "outbox.dispatch.failed"}, True),
        ({"error": TimeoutError("timed out")}, True),
    ],
    ids=["same-kind", "other-event", "other-exception-class"],
)
def test_the_kind_is_logger_event_and_exception_class(second, separate):
    clock = Clock()
    logger, stream = make_logger("kinds", RepeatedIncidentFilter(60, clock=clock))
    raise_and_log(logger)
    raise_and_log(logger, **second)
    assert stream.getvalue().count("Traceback") == (2 if separate else 1)


def test_server_errors_without_exception_are_incidents_too_and_other_lines_are_untouched():
    clock = Clock()
    logger, stream = make_logger("status", RepeatedIncidentFilter(60, clock=clock))
    for _ in range(100):
        # What django.request writes for every 503 the view returns.
        logger.error(
            "%s: %s", "Service Unavailable", "/webhooks/github/", extra={"status_code": 503}
        )
        logger.warning("%s: %s", "Not Found", "/webhooks/nope/", extra={"status_code": 404})
        logger.info("ingress.verify.batch_settled", extra={"events": 1})
    output = stream.getvalue()
    assert output.count("Service Unavailable") == 1
    assert output.count("Not Found") == 100
    assert output.count("batch_settled") == 100


def test_other_handlers_still_get_the_whole_record():
    clock = Clock()
    incident_filter = RepeatedIncidentFilter(60, clock=clock)
    logger, _ = make_logger("others", incident_filter)
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    logger.addHandler(Keep())
    raise_and_log(logger)
    raise_and_log(logger)
    clock.now += 60
    raise_and_log(logger)
    assert len(seen) == 3 and all(record.exc_info for record in seen)


def test_the_kinds_remembered_are_bounded():
    clock = Clock()
    incident_filter = RepeatedIncidentFilter(60, clock=clock)
    logger, _ = make_logger("bounded", incident_filter)
    for n in range(MAX_INCIDENT_KINDS + 50):
        raise_and_log(logger, event=f"event.{n}")
    assert len(incident_filter._incidents) == MAX_INCIDENT_KINDS


def test_the_project_logging_installs_both_filters():
    [handler] = [h for h in logging.getLogger().handlers if h.get_name() == "console"]
    kinds = {type(f) for f in handler.filters}
    assert kinds == {RedactSearchTerms, RepeatedIncidentFilter}
    # Django's own loggers reach this handler instead of handlers of their own.
    for name in ("django", "django.request", "django.server"):
        logger = logging.getLogger(name)
        assert not logger.handlers and logger.propagate, name


# --- the log of a real run -----------------------------------------------------------------

MARKERS = {
    "body": "BODYMARK-7f3a1c",
    "header": "HEADERMARK-91c2ee",
    "secret": "SECRETMARK-5d0e-github-signing-secret",
    "search": "SEARCHMARK-2b77aa",
    "refused_search": "SEARCHMARK-refused-4e1f",
    "admin_search": "SEARCHMARK-admin-c3d4",
    "password": "PASSWORDMARK-88aa-long-enough",
    "bad_token": "TOKENMARK0123456789abcdef",
}
OUTAGE_SECONDS = 4.0
REPEAT_INTERVAL_SECONDS = 1.5
# One kind of incident writes at most one line per interval (plus the first, with its
# traceback); the outage shows up as a few kinds: the view's store failure and the API's
# (each with its traceback once), and django.request's 503 line.
INCIDENT_KINDS = 3
MAX_LINES_PER_KIND = 1 + int(OUTAGE_SECONDS / REPEAT_INTERVAL_SECONDS) + 2

SETUP_USERS = """
from django.contrib.auth.models import Permission, User
from console.services import api_token_issue
perms = Permission.objects.filter(codename__in=[
    "view_rawevent", "view_delivery", "view_raw_payload", "view_ops"])
reader = User.objects.create_user("reader", password="{password}", is_staff=True)
reader.user_permissions.set(perms)
operator = User.objects.create_user("operator", is_staff=True)
operator.user_permissions.set(perms.exclude(codename="view_raw_payload"))
print("reader", api_token_issue(user=reader, ttl_days=1)[1])
print("operator", api_token_issue(user=operator, ttl_days=1)[1])
"""


class Http:
    """One HTTP/1.1 client with cookies, against the web process on 127.0.0.1."""

    def __init__(self, port: int):
        self.port = port
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, body: bytes = b"", headers=None):
        import http.client

        headers = dict(headers or {})
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request(method, path, body=body or None, headers=headers)
            response = connection.getresponse()
            content = response.read()
        finally:
            connection.close()
        for header in response.headers.get_all("Set-Cookie") or ():
            name, _, rest = header.partition("=")
            self.cookies[name] = rest.split(";", 1)[0]
        return response.status, content


def signed_github(n: int, secret: str, *, good: bool = True) -> tuple[bytes, dict]:
    import hashlib
    import hmac
    import json

    body = json.dumps({"zen": MARKERS["body"], "n": n}).encode()
    key = secret if good else "wrong-secret"
    digest = hmac.new(key.encode(), body, hashlib.sha256).hexdigest()
    return body, {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": f"delivery-{n}",
        "X-Custom-Note": MARKERS["header"],
    }


@pytest.mark.slow
@pytest.mark.faults
def test_the_logs_of_a_real_run_hold_no_marker_and_a_bounded_outage(tmp_path):
    """About 30 s: a cluster, migrations, the web process, an outage, the inbox."""
    import re
    import time
    from urllib.parse import urlencode

    from tests.support.pg_cluster import throwaway_cluster
    from tests.support.processes import (
        app_env,
        free_port,
        manage,
        migrate,
        start_procfile,
    )

    log_path = tmp_path / "web.log"
    with throwaway_cluster(prefix="edlog") as cluster:
        cluster.createdb("eventdrop")
        env = app_env(
            cluster.url("eventdrop"),
            GITHUB_WEBHOOK_SECRET=MARKERS["secret"],
            LOG_REPEAT_INTERVAL_SECONDS=str(REPEAT_INTERVAL_SECONDS),
            WEB_CONCURRENCY="1",
            DATABASE_CONNECT_TIMEOUT="1",
        )
        migrate(env)
        users = manage("shell", "-c", SETUP_USERS.format(password=MARKERS["password"]), env=env)
        tokens = {
            name: token
            for name, _, token in (line.partition(" ") for line in users.stdout.splitlines())
            if name in ("reader", "operator")
        }
        port = free_port()
        web = start_procfile("web", env, port=port, log=log_path)
        answers: dict[int, int] = {}
        try:
            web.wait_listening(port, timeout=30)
            http = Http(port)
            reader = {"Authorization": f"Token {tokens['reader']}"}
            operator = {"Authorization": f"Token {tokens['operator']}"}

            for n in range(5):
                assert (
                    http.request("POST", "/webhooks/github/", *signed_github(n, MARKERS["secret"]))[
                        0
                    ]
                    == 202
                )
            assert (
                http.request("POST", "/webhooks/github/", *signed_github(99, "", good=False))[0]
                == 202
            )

            # Searches: allowed (200), malformed (400, logged), refused (403, logged).
            search = urlencode({"body_contains": MARKERS["search"]})
            assert http.request("GET", f"/api/raw-events/?{search}", headers=reader)[0] == 200
            bad = urlencode({"q": MARKERS["search"], "stauts": "x"})
            assert http.request("GET", f"/api/raw-events/?{bad}", headers=reader)[0] == 400
            refused = urlencode({"body_contains": MARKERS["refused_search"]})
            assert http.request("GET", f"/api/raw-events/?{refused}", headers=operator)[0] == 403
            # Credentials that do not work: a made-up token, Basic with the real password.
            bad_token = {"Authorization": f"Token {MARKERS['bad_token']}"}
            assert http.request("GET", "/api/raw-events/", headers=bad_token)[0] == 401
            import base64

            basic = base64.b64encode(f"reader:{MARKERS['password']}".encode()).decode()
            assert (
                http.request(
                    "GET", "/api/raw-events/", headers={"Authorization": f"Basic {basic}"}
                )[0]
                == 401
            )

            # The admin: sign in, search bodies, open a page with the search carried along.
            http.request("GET", "/admin/login/")
            login = urlencode(
                {
                    "username": "reader",
                    "password": MARKERS["password"],
                    "csrfmiddlewaretoken": http.cookies["csrftoken"],
                    "next": "/admin/",
                }
            ).encode()
            form = {"Content-Type": "application/x-www-form-urlencoded"}
            assert http.request("POST", "/admin/login/", login, form)[0] == 302
            admin_search = urlencode({"q": MARKERS["admin_search"]})
            assert http.request("GET", f"/admin/ingress/rawevent/?{admin_search}")[0] == 200
            carried = urlencode({"_changelist_filters": admin_search})
            assert http.request("GET", f"/admin/ingress/rawevent/1/change/?{carried}")[0] == 200
            assert http.request("GET", f"/admin/ingress/rawevent/999999/nope/?{admin_search}")[
                0
            ] in (302, 404)

            # The outage: every webhook is a 503 while the database is down.
            cluster.stop("fast")
            deadline = time.monotonic() + OUTAGE_SECONDS
            n = 1000
            while time.monotonic() < deadline:
                n += 1
                status, _ = http.request(
                    "POST", "/webhooks/github/", *signed_github(n, MARKERS["secret"])
                )
                answers[status] = answers.get(status, 0) + 1
                if n % 10 == 0:
                    status, _ = http.request("GET", f"/api/raw-events/?{search}", headers=reader)
                    answers[status] = answers.get(status, 0) + 1
            cluster.start()
            recovered = False
            for n in range(2000, 2050):
                if (
                    http.request("POST", "/webhooks/github/", *signed_github(n, MARKERS["secret"]))[
                        0
                    ]
                    == 202
                ):
                    recovered = True
                    break
                time.sleep(0.1)
            assert recovered
        finally:
            web.stop()
        inbox = manage("process_inbox", "--once", env=env)

    log = log_path.read_text(errors="replace") + inbox.stdout + inbox.stderr
    lines = log.splitlines()
    # Every answer during the outage is a 503 to retry: webhooks and the API alike.
    assert set(answers) == {503} and answers[503] >= 50, answers

    for name, marker in {**MARKERS, **{f"token_{k}": v for k, v in tokens.items()}}.items():
        assert marker not in log, f"the {name} marker is in the log"
    # The refused and malformed searches were logged, with the term redacted.
    assert "body_contains=[redacted]" in log and "Forbidden: /api/raw-events/" in log

    # Log records (a line that starts with a timestamp), and those that carry a traceback.
    record = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
    records = [n for n, line in enumerate(lines) if record.match(line)]
    with_traceback = [
        n for n in records if n + 1 < len(lines) and lines[n + 1].startswith("Traceback")
    ]
    outage = [
        lines[n]
        for n in records
        if re.search(r"store_failed|database_unavailable|Service Unavailable", lines[n])
    ]
    shown = "\n".join(outage)
    assert 1 <= len(with_traceback) <= INCIDENT_KINDS, shown
    assert len(outage) <= INCIDENT_KINDS * MAX_LINES_PER_KIND, shown
    assert any("suppressed=" in line for line in outage), shown
    # Hundreds of failed requests, a few dozen log records.
    assert len(records) < 60, f"{len(records)} records for {sum(answers.values())} requests"


def test_an_extra_that_is_not_a_plain_value_is_named_by_its_type_only():
    # runserver's django.server lines pass the connection's socket as `request`; its repr
    # names the file descriptor and the client's address, and is no log field.
    import socket

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(KeyValueFormatter("%(message)s"))
    logger = logging.getLogger("tests.logformat.extras")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            logger.warning(
                '"GET / HTTP/1.1" 200 5',
                extra={"request": sock, "status_code": 200, "ids": [1, 2], "server_time": "x"},
            )
    finally:
        logger.removeHandler(handler)
    line = stream.getvalue().strip()
    assert line == (
        "\"GET / HTTP/1.1\" 200 5 ids=[1, 2] request=<socket> server_time='x' status_code=200"
    )
