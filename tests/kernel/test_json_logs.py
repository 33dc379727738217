"""LOG_FORMAT=json: one JSON object per line, the same fields as the key=value default, and
the same filters (search terms redacted, repeated incidents rate-limited) in front of it."""

import io
import json
import logging
import re
import uuid

import pytest

from kernel.logformat import (
    JsonFormatter,
    KeyValueFormatter,
    RedactSearchTerms,
    RepeatedIncidentFilter,
)
from tests.support.processes import app_env, manage

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
DATABASE_URL = "postgres://postgres@127.0.0.1:5432/eventdrop_h2"


def logger_with(formatter: logging.Formatter, *filters: logging.Filter):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    for item in filters:
        handler.addFilter(item)
    logger = logging.getLogger(f"test.json.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger, stream


def test_both_formats_carry_the_same_fields():
    recap = uuid.UUID(int=7)
    extra = {"raw_event_id": 42, "recap_id": recap, "handler": "h.x", "attempt": 2}
    plain_logger, plain = logger_with(KeyValueFormatter(FORMAT))
    json_logger, as_json = logger_with(JsonFormatter(FORMAT))
    for logger in (plain_logger, json_logger):
        logger.warning("ingress.deliver.failed", extra=extra)

    line = plain.getvalue().strip()
    record = json.loads(as_json.getvalue())
    assert record["event"] == "ingress.deliver.failed" and "ingress.deliver.failed" in line
    assert record["level"] == "WARNING" and " WARNING " in line
    assert record["logger"] == json_logger.name and f" {plain_logger.name} " in line
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", record["time"])
    assert line.startswith(record["time"][:16])
    # Every extra field in both, under the same name.
    keys = dict(re.findall(r" (\w+)=(\S+)", line))
    assert set(keys) == set(extra) <= set(record)
    assert record["raw_event_id"] == 42 and record["recap_id"] == str(recap)
    assert keys["raw_event_id"] == "42" and keys["recap_id"] == repr(recap).split(" ")[0]


def test_an_object_that_is_no_plain_value_is_named_by_its_type_in_both():
    class Connection:
        def __repr__(self):
            return "<socket fd=7 raddr=('10.0.0.1', 5555)>"

        __str__ = __repr__

    plain_logger, plain = logger_with(KeyValueFormatter(FORMAT))
    json_logger, as_json = logger_with(JsonFormatter(FORMAT))
    for logger in (plain_logger, json_logger):
        logger.info("django.server", extra={"request": Connection()})
    assert "request=<Connection>" in plain.getvalue()
    assert json.loads(as_json.getvalue())["request"] == "<Connection>"
    assert "10.0.0.1" not in plain.getvalue() + as_json.getvalue()


def test_the_filters_work_in_front_of_the_json_format():
    clock = [0.0]
    logger, stream = logger_with(
        JsonFormatter(FORMAT),
        RedactSearchTerms(),
        RepeatedIncidentFilter(interval_seconds=60, clock=lambda: clock[0]),
    )
    logger.info('"GET /admin/ingress/rawevent/?q=cs_live_needle HTTP/1.1" 200')
    for _ in range(3):
        try:
            raise ConnectionError("server closed the connection")
        except ConnectionError:
            logger.exception("ingress.store.failed", extra={"source": "stripe"})
    clock[0] = 61.0
    try:
        raise ConnectionError("server closed the connection")
    except ConnectionError:
        logger.exception("ingress.store.failed", extra={"source": "stripe"})

    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert "cs_live_needle" not in stream.getvalue()
    assert "q=[redacted]" in records[0]["event"]
    # The first incident whole, with its traceback; then one summary, without.
    assert len(records) == 3
    assert "ConnectionError" in records[1]["exc_info"]
    summary = records[2]
    assert (summary["suppressed"], summary["exception"]) == (2, "ConnectionError")
    assert "exc_info" not in summary


@pytest.mark.slow  # starts a process (tests/conftest.py)
@pytest.mark.parametrize("log_format", ["json", "plain"])
def test_the_setting_chooses_the_format_of_a_real_process(log_format):
    snippet = (
        "import logging; "
        "logging.getLogger('ingress.inbox').info('ingress.verify.batch_settled', "
        "extra={'events': 3}); "
        "logging.getLogger('django.server').info('GET /api/raw-events/?body_contains=pii 200')"
    )
    env = app_env(DATABASE_URL, LOG_FORMAT=log_format)
    result = manage("shell", "-c", snippet, env=env, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, result.stderr
    assert "pii" not in result.stderr
    if log_format == "json":
        first, second = (json.loads(line) for line in lines)
        assert (first["event"], first["events"], first["logger"]) == (
            "ingress.verify.batch_settled",
            3,
            "ingress.inbox",
        )
        assert "body_contains=[redacted]" in second["event"]
    else:
        assert lines[0].endswith("INFO ingress.inbox ingress.verify.batch_settled events=3")
        with pytest.raises(json.JSONDecodeError):
            json.loads(lines[0])


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_an_unknown_format_is_refused_naming_the_setting():
    env = app_env(DATABASE_URL, LOG_FORMAT="xml")
    with pytest.raises(RuntimeError, match="LOG_FORMAT must be plain or json, got 'xml'"):
        manage("check", env=env, timeout=60)
