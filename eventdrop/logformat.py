"""Structured log lines: the event name, then the `extra=` fields as key=value pairs.

Log calls name an event (`"ingress.deliver.failed"`) and pass ids in `extra`; this formatter
makes those ids visible in plain-text logs. Payloads and secrets are never passed in
`extra` in the first place.
"""

import logging

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
