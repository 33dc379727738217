"""Turning a stored body into the dict a handler receives.

Only called after verification, never on the receive path. Providers send JSON, except
GitHub's and Slack's form-encoded variants (`payload=<json>` or plain form fields).
"""

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

from eventdrop.errors import EventDropError

UNPARSEABLE_BODY = "The body is neither a JSON object nor a form the provider sends."


class UnparseablePayload(EventDropError):
    pass


def _is_form(headers: Mapping[str, str]) -> bool:
    content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return content_type == "application/x-www-form-urlencoded"


def parse_payload(headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    try:
        text = body.decode("utf-8")
        if _is_form(headers):
            fields = dict(parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text)))
            data: Any = json.loads(fields["payload"]) if "payload" in fields else fields
        else:
            data = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnparseablePayload(UNPARSEABLE_BODY) from exc
    if not isinstance(data, dict):
        raise UnparseablePayload(UNPARSEABLE_BODY)
    return data
