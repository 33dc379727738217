"""Logs: search terms never reach them, and one incident is a bounded number of lines.

The unit tests drive eventdrop.logformat's filters through a real logger, handler and
formatter. The last test greps the log of a real run: the Procfile's web process and the
inbox worker against a throw-away PostgreSQL cluster, requests carrying markers in bodies,
headers, secrets, tokens and search terms, and a database outage in the middle.
"""

import io
import logging

import pytest

from eventdrop.logformat import (
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
