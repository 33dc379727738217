"""Structured log lines, and the two filters every log line passes.

KeyValueFormatter: the event name, then the `extra=` fields as key=value pairs. Log calls
name an event (`"ingress.deliver.failed"`) and pass ids in `extra`; this formatter makes
those ids visible in plain-text logs. Payloads and secrets are never passed in `extra` in
the first place.

RedactSearchTerms: body-search terms in URLs (the admin's `?q=`, the API's `body_contains`)
are body fragments; no log line carries them.

RepeatedIncidentFilter: one line per incident kind with a counter, not a traceback per
failed request (a database restart once wrote 4,478 tracebacks, 13 MB, in minutes).
"""

import logging
import re
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from datetime import time as time_of_day
from decimal import Decimal
from typing import Any
from uuid import UUID

import pythonjsonlogger.json
from django.http import HttpRequest

from kernel import tracing

_STANDARD_ATTRS = frozenset(
    logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None).__dict__
) | {"message", "asctime", "taskName"}


class _SummaryWithoutTraceback:
    """Both formatters: a RepeatedIncidentFilter summary line carries no traceback."""

    def _line(self, record: logging.LogRecord) -> str:
        """The formatter's own line for `record` (each formatter defines it)."""
        raise NotImplementedError

    def format(self, record: logging.LogRecord) -> str:
        if not getattr(record, "suppressed", None):
            return self._line(record)
        # A RepeatedIncidentFilter summary: the incident's traceback was written already.
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        try:
            return self._line(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


class KeyValueFormatter(_SummaryWithoutTraceback, logging.Formatter):
    def _line(self, record: logging.LogRecord) -> str:
        line = logging.Formatter.format(self, record)
        extras = {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS}
        if extras:
            line += " " + " ".join(
                f"{key}={_field(value)}" for key, value in sorted(extras.items())
            )
        return line


_PLAIN_VALUES = (str, bytes, int, float, bool, type(None), Decimal, UUID, date, time_of_day,
                 timedelta)


def _is_plain(value: Any) -> bool:
    if isinstance(value, _PLAIN_VALUES):
        return True
    if isinstance(value, list | tuple | set | frozenset):
        return all(_is_plain(item) for item in value)
    if isinstance(value, dict):
        return all(_is_plain(key) and _is_plain(item) for key, item in value.items())
    return False


def _field(value: Any) -> str:
    """A plain value as its repr; any other object by its type only. runserver passes the
    connection's socket as `request`, whose repr (file descriptor, client address) is no
    log field."""
    return repr(value) if _is_plain(value) else f"<{type(value).__name__}>"


class JsonFormatter(_SummaryWithoutTraceback, pythonjsonlogger.json.JsonFormatter):
    """LOG_FORMAT=json: one JSON object per line for a log shipper, with the fields the
    key=value line has — `time`, `level`, `logger`, `event` (the message), every `extra`
    field under its own name (an object that is not a plain value by its type only, as
    there), and `exc_info` with the traceback where the plain line appends it; with
    tracing on, `trace_id` and `span_id` of the span it was written in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("rename_fields", JSON_FIELD_NAMES)
        kwargs.setdefault("reserved_attrs", sorted(_STANDARD_ATTRS))
        super().__init__(*args, **kwargs)

    def _line(self, record: logging.LogRecord) -> str:
        return pythonjsonlogger.json.JsonFormatter.format(self, record)

    def add_fields(self, log_data: dict, record: logging.LogRecord, message_dict: dict) -> None:
        super().add_fields(log_data, record, message_dict)
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and key in log_data:
                log_data[key] = _json_field(value)
        # The span the line was written in (kernel/tracing.py): a log line finds its trace.
        log_data.update(tracing.log_fields())


# The record attributes of the plain format's "%(asctime)s %(levelname)s %(name)s
# %(message)s", under the names a shipper expects.
JSON_FIELD_NAMES = {"asctime": "time", "levelname": "level", "name": "logger", "message": "event"}


def _json_field(value: Any) -> Any:
    if not _is_plain(value):
        return f"<{type(value).__name__}>"
    if isinstance(value, bytes | Decimal | UUID | date | time_of_day | timedelta):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return value


def raised_at(exc: BaseException) -> str:
    """Where `exc` was raised, as `file:line in function`: a log field that locates a failure
    without its message, which may quote a payload."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


# --- search terms never reach a log line ----------------------------------------------------

# Query parameters whose values are body fragments: the admin's search box (`q`) and the
# API's `q` / `body_contains`, and the admin's `_changelist_filters`, which carries the
# changelist's query (search included, percent-encoded) onto every page opened from it;
# and filters on a body's hash (`body_sha256`, `dedup_key`, with any lookup), which confirm a
# guessed body. Their terms are kept only in console.PayloadAccess.
REDACTED_QUERY_PARAMETERS = (
    "q",
    "body_contains",
    "_changelist_filters",
    "body_sha256",
    "dedup_key",
)
REDACTED = "[redacted]"
_SEARCH_PARAMETER = re.compile(
    r"(?P<name>(?:^|(?<=[?&;]))(?:"
    + "|".join(REDACTED_QUERY_PARAMETERS)
    + r")(?:__\w+)?=)[^&;#\s'\"]*"
)


def redact_search_terms(text: str) -> str:
    """`/admin/…/?q=cs_live_123&source=x` → `/admin/…/?q=[redacted]&source=x`.

    Matches the parameters inside any URL or bare query string in `text` (a value ends at
    `&`, `;`, `#`, a quote or white space); nothing else in the line changes.
    """
    if "=" not in text:
        return text
    return _SEARCH_PARAMETER.sub(lambda match: match["name"] + REDACTED, text)


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact_search_terms(value)
    if isinstance(value, HttpRequest):
        # django.request passes the request in `extra`, and its repr is the full URL.
        return (
            f"<{type(value).__name__}: {value.method} {redact_search_terms(value.get_full_path())}>"
        )
    return value


class RedactSearchTerms(logging.Filter):
    """Applied to every handler: search terms leave the process in no log line.

    django.request (4xx/5xx warnings), django.server (runserver's request lines) and a web
    server's access log all write the request's URL with its query string; this rewrites
    the message, its arguments (tuple or mapping, as an access log passes them) and any
    `extra` value before the line is formatted.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = _redacted(record.msg)
        if isinstance(record.args, Mapping):
            record.args = {key: _redacted(value) for key, value in record.args.items()}
        elif isinstance(record.args, tuple):
            record.args = tuple(_redacted(value) for value in record.args)
        for key, value in list(record.__dict__.items()):
            if key not in _STANDARD_ATTRS and isinstance(value, str | HttpRequest):
                setattr(record, key, _redacted(value))
        return True


# --- one line per incident, not a traceback per request -------------------------------------

# Distinct incident kinds remembered at once; past that the least recently seen are dropped
# (a message that embeds ids would otherwise make one key per line).
MAX_INCIDENT_KINDS = 1000


@dataclass
class _Incident:
    emitted_at: float
    suppressed: int = 0


class RepeatedIncidentFilter(logging.Filter):
    """Rate-limits repeated failures: the first with its traceback, then one summary line
    per interval with how many were suppressed.

    An incident is a record with an exception, or a response of 500 or more that
    django.request reports; its kind is (logger, message template, exception class or HTTP
    status). The first record of a kind passes whole. Others of that kind within
    `interval_seconds` of the last line written are counted and dropped. The first one after
    the interval passes as a summary: the same event name, `suppressed=<count>` and
    `exception=<class>`, and no traceback — the incident is still the one already shown.
    When a kind has been quiet for a whole interval its next record passes whole again.
    So a kind writes at most one line per interval, however many requests fail: 2,239
    database errors in one minute are one traceback and, a minute later, one line with
    the count. Records that are not incidents are never touched.
    """

    def __init__(self, interval_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.interval_seconds = float(interval_seconds)
        self._clock = clock
        self._incidents: OrderedDict[tuple, _Incident] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _kind(record: logging.LogRecord) -> tuple | None:
        template = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        if record.exc_info and record.exc_info[0] is not None:
            return (record.name, template, record.exc_info[0].__qualname__)
        status = getattr(record, "status_code", None)
        if isinstance(status, int) and status >= 500:
            return (record.name, template, status)
        return None

    def filter(self, record: logging.LogRecord) -> bool:
        kind = self._kind(record)
        if kind is None:
            return True
        now = self._clock()
        with self._lock:
            incident = self._incidents.get(kind)
            if incident is not None and now - incident.emitted_at < self.interval_seconds:
                incident.suppressed += 1
                return False
            suppressed = incident.suppressed if incident is not None else 0
            self._incidents[kind] = _Incident(emitted_at=now)
            self._incidents.move_to_end(kind)
            while len(self._incidents) > MAX_INCIDENT_KINDS:
                self._incidents.popitem(last=False)
        if suppressed:
            # Marked, not stripped: other handlers (a test's capture) still get the record
            # whole; KeyValueFormatter leaves the traceback out of a summary.
            if record.exc_info and record.exc_info[0] is not None:
                record.exception = record.exc_info[0].__qualname__
            record.suppressed = suppressed
            record.suppressed_within_seconds = self.interval_seconds
        return True
