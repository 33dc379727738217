"""Turning a stored body into the dict a handler receives.

Only called after verification, never on the receive path. It reuses the verifiers' own
parsing rules (ingress/verifiers/common.py), so every body a verifier accepted parses here
the same way: JSON objects, and GitHub's and Slack's form-encoded variants (`payload=<json>`
or plain form fields).
"""

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from eventdrop.errors import EventDropError
from ingress.verifiers.base import StoredRequest
from ingress.verifiers.common import (
    Reject,
    body_text,
    form_fields,
    form_payload,
    is_form_encoded,
    json_object,
)

UNPARSEABLE_BODY = "The body is neither a JSON object nor a form the provider sends."


class UnparseablePayload(EventDropError):
    pass


def parse_payload(headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    # received_at plays no part in parsing; the helpers take the stored request as a whole.
    request = StoredRequest(
        headers=headers, body=body, received_at=datetime.min.replace(tzinfo=UTC)
    )
    try:
        text = body_text(request)
        if not is_form_encoded(request):
            return json_object(text)
        fields = form_fields(text)
        return form_payload(fields) if "payload" in fields else fields
    except Reject as exc:
        raise UnparseablePayload(UNPARSEABLE_BODY) from exc
