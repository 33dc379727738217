"""How a stored body and headers are shown to an operator (admin) or returned (API).

Bodies are bytes from the outside world. They are shown as text only after the caller's
template escapes them; nothing here marks anything safe. JSON is pretty-printed, other UTF-8
as it is, anything else as a hex dump — a body that is not UTF-8 must never break a page.
"""

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone
from django.utils.html import format_html

from kernel.tracing import trace_id_of, trace_url

# What every console page shows for "nothing here" (the admin's empty_value_display too).
EMPTY = "—"
# An on-call page must stay light even for a body at the 1 MiB receive limit.
BODY_DISPLAY_CHARS = 256 * 1024
HEX_PREVIEW_BYTES = 4 * 1024
_HEX_ROW = 16


class BodyKind:
    EMPTY = "empty"
    JSON = "json"
    TEXT = "text"
    BINARY = "binary"


@dataclass(frozen=True)
class BodyView:
    kind: str
    text: str
    size: int
    truncated: bool


def hex_dump(data: bytes) -> str:
    """`offset  hex bytes  |printable|`, 16 bytes a row, like `hexdump -C`."""
    rows = []
    for offset in range(0, len(data), _HEX_ROW):
        chunk = data[offset : offset + _HEX_ROW]
        hex_part = " ".join(f"{byte:02x}" for byte in chunk)
        printable = "".join(chr(byte) if 0x20 <= byte < 0x7F else "." for byte in chunk)
        rows.append(f"{offset:08x}  {hex_part:<{_HEX_ROW * 3 - 1}}  |{printable}|")
    return "\n".join(rows)


def body_view(body: bytes) -> BodyView:
    size = len(body)
    if not body:
        return BodyView(kind=BodyKind.EMPTY, text="", size=0, truncated=False)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        preview = body[:HEX_PREVIEW_BYTES]
        return BodyView(
            kind=BodyKind.BINARY, text=hex_dump(preview), size=size, truncated=size > len(preview)
        )
    kind = BodyKind.TEXT
    try:
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=False)
        kind = BodyKind.JSON
    except ValueError:
        pass
    truncated = len(text) > BODY_DISPLAY_CHARS
    return BodyView(kind=kind, text=text[:BODY_DISPLAY_CHARS], size=size, truncated=truncated)


def headers_rows(headers: Mapping[str, object]) -> list[tuple[str, str]]:
    return sorted((str(name), str(value)) for name, value in headers.items())


def body_for_api(body: bytes) -> dict:
    """Exact bytes for a machine: text when it is UTF-8, base64 otherwise."""
    try:
        return {"encoding": "utf-8", "data": body.decode("utf-8"), "size": len(body)}
    except UnicodeDecodeError:
        return {
            "encoding": "base64",
            "data": base64.b64encode(body).decode("ascii"),
            "size": len(body),
        }


def seconds_between(start, end) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return EMPTY
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# Bodies, headers, body search and handler messages (which may quote a body) are shown only
# with this permission (ingress.models.RawEvent's Meta), in the admin and the API alike.
VIEW_PAYLOAD_PERMISSION = "ingress.view_raw_payload"
# Columns a list never needs: a page of 100 rows must not drag 100 MiB of bodies along.
PAYLOAD_FIELDS = ("body", "headers")


def may_read_payload(user) -> bool:
    return user.has_perm(VIEW_PAYLOAD_PERMISSION)


# A handler's exception message is free text, and handlers format payload values into it
# (`recap id '<from the body>' not found`). Staff who may not read payloads see the class.
ERROR_DETAIL_HIDDEN = (
    "message hidden: a handler's message may quote the payload "
    "(shown with the permission ingress.view_raw_payload)"
)
_ERROR_CLASS = re.compile(r"[A-Za-z_][\w.]*")


def error_for_viewer(error: str, *, may_read_payload: bool) -> str:
    """A stored delivery error (`Class: message`) as this viewer may see it.

    With the payload permission, the whole text; without it, the exception class (from our
    code, never from the payload) and a fixed sentence — so nothing a handler quoted from a
    body reaches them. Text that does not start with a class name shows as `error`.
    """
    if may_read_payload or not error:
        return error
    head, separator, _ = error.partition(":")
    error_class = head if separator and _ERROR_CLASS.fullmatch(head) else "error"
    return f"{error_class}: {ERROR_DETAIL_HIDDEN}"


# A list column shows this much of an error or a failure reason; the row's page all of it.
SHORT_TEXT_CHARS = 120


def shortened(text: str, limit: int = SHORT_TEXT_CHARS) -> str:
    return text[:limit] + ("…" if len(text) > limit else "")


# --- Reading a row at a glance ------------------------------------------------------------------

# Every status the console colours, by what it asks of the reader. The word is always shown
# too (the colour only repeats it), so a status reads the same without colour.
STATUS_TONES = {
    # ok: finished well
    "verified": "ok",
    "done": "ok",
    "dispatched": "ok",
    "complete": "ok",
    "ready": "ok",
    "succeeded": "ok",
    "ok": "ok",
    "resolved": "ok",
    "closed": "ok",
    # wait: under way, nothing to do yet
    "pending": "wait",
    "waiting": "wait",
    "processing": "wait",
    "paid": "wait",
    "rendering": "wait",
    "running": "wait",
    "queued": "wait",
    "previewed": "wait",
    "cancelling": "wait",
    "transient": "wait",
    "acknowledged": "wait",
    "pending_payment": "wait",
    "half_open": "warn",
    # warn: a look is needed
    "no_handler": "warn",
    "held": "warn",
    "partial": "warn",
    "refused": "warn",
    "incomplete": "warn",
    "open": "bad",
    # bad: failed
    "rejected": "bad",
    "not_dispatched": "bad",
    "dead": "bad",
    "failed": "bad",
    "error": "bad",
    "permanent": "bad",
    # quiet: nothing to do
    "duplicate": "quiet",
    "superseded": "quiet",
    "cancelled": "quiet",
}


def status_tone(status: str) -> str:
    return STATUS_TONES.get(status, "quiet")


def format_time_parts(value, now) -> tuple[str, str]:
    """(`2026-12-01 10:03:12 UTC`, `5.0 min ago`): a stored time to the second, in the
    server's zone (UTC), and how long ago it was (`in …` for a future time)."""
    stamp = timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")
    seconds = (now - value).total_seconds()
    relative = (
        f"{format_seconds(seconds)} ago" if seconds >= 0 else f"in {format_seconds(-seconds)}"
    )
    return stamp, relative


def format_time(value, now) -> str:
    """The console's one time format: `2026-12-01 10:03:12 UTC · 5.0 min ago`."""
    if value is None:
        return EMPTY
    return " · ".join(format_time_parts(value, now))


def trace_link(traceparent: str) -> str:
    """A row's trace: its id, linked through TRACE_URL_TEMPLATE when one is set."""
    trace_id = trace_id_of(traceparent)
    if not trace_id:
        return EMPTY
    url = trace_url(traceparent, settings.TRACE_URL_TEMPLATE)
    if not url:
        return trace_id
    return format_html('<a href="{}" rel="noopener noreferrer">{}</a>', url, trace_id)
