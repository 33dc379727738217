"""Structured log lines: the event name, then the `extra=` fields as key=value pairs.

Log calls name an event (`"ingress.deliver.failed"`) and pass ids in `extra`; this formatter
makes those ids visible in plain-text logs. Payloads and secrets are never passed in
`extra` in the first place.
"""

import logging
import traceback

_STANDARD_ATTRS = frozenset(
    logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None).__dict__
) | {"message", "asctime", "taskName"}


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS}
        if extras:
            line += " " + " ".join(f"{key}={value!r}" for key, value in sorted(extras.items()))
        return line


def raised_at(exc: BaseException) -> str:
    """Where `exc` was raised, as `file:line in function`: a log field that locates a failure
    without its message, which may quote a payload."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"
