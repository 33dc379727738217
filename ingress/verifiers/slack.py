"""Slack: `X-Slack-Signature: v0=<hex>` = HMAC-SHA256(signing secret, `v0:<ts>:<body>`).

`<ts>` is the `X-Slack-Request-Timestamp` header exactly as sent. One signing secret covers
three body kinds: Events API JSON, slash-command forms, and interactivity forms carrying JSON
in `payload=`. Slack retries an Events API delivery it thinks failed and says so in
`X-Slack-Retry-Num` / `-Reason`; those are recorded for forensics, never used to drop an event
(dedup on `event_id` does that job).
"""

import re
from dataclasses import replace
from typing import Any

from ingress.models import RejectionReason
from ingress.verifiers.base import Source, StoredRequest, Verdict
from ingress.verifiers.common import (
    Reject,
    body_text,
    check_timestamp,
    form_fields,
    form_payload,
    is_form_encoded,
    json_object,
    match_hex_hmac,
    required_header,
    returns_verdict,
    scheme_hex_signature,
    signature_header,
    string_field,
    unix_timestamp,
    usable_secrets,
    utf8_secret,
)

TIMESTAMP_HEADER = "x-slack-request-timestamp"
VERSION = "v0"

# The retry number is an unsigned header bound for a small-integer column: anything but a
# few ASCII digits is no count Slack sends, so it is not recorded (and never rejects).
_RETRY_NUM = re.compile(r"[0-9]{1,4}")


@returns_verdict
def verify(source: Source, request: StoredRequest) -> Verdict:
    keys = usable_secrets(source, utf8_secret)
    header = signature_header(source, request)
    # A signature without its timestamp cannot be checked: the header set is malformed.
    timestamp = required_header(request, TIMESTAMP_HEADER, RejectionReason.MALFORMED_HEADER)
    signed_at = unix_timestamp(timestamp)
    signature = scheme_hex_signature(header, VERSION)
    base_string = f"{VERSION}:{timestamp}:".encode() + request.body
    secret_index = match_hex_hmac(keys, base_string, [signature])
    check_timestamp(signed_at, request, source.tolerance_seconds)
    return replace(
        _classify(request),
        secret_index=secret_index,
        provider_retry_num=_retry_num(request),
        provider_retry_reason=request.headers.get("x-slack-retry-reason", ""),
    )


def _classify(request: StoredRequest) -> Verdict:
    """The routing fields of the (already authenticated) body."""
    text = body_text(request)
    if not is_form_encoded(request):
        return _events_api(json_object(text))
    fields = form_fields(text)
    if "payload" in fields:
        return Verdict(event_type=string_field(form_payload(fields), "type"))
    if "command" in fields:
        return Verdict(event_type="slash_command")
    raise Reject(RejectionReason.UNPARSEABLE_BODY)


def _events_api(body: dict[str, Any]) -> Verdict:
    body_type = string_field(body, "type")
    if body_type == "url_verification":
        # Echoed synchronously by the receive path, so only ever taken from a signed body.
        return Verdict(
            event_type=body_type, handshake_challenge=string_field(body, "challenge") or None
        )
    if body_type == "event_callback":
        event = body.get("event")
        return Verdict(
            event_type=string_field(event, "type") if isinstance(event, dict) else "",
            provider_event_id=string_field(body, "event_id"),
        )
    return Verdict(event_type=body_type)


def _retry_num(request: StoredRequest) -> int | None:
    value = request.headers.get("x-slack-retry-num", "")
    return int(value) if _RETRY_NUM.fullmatch(value) else None
