"""Turning a stored body into the dict a handler receives.

Only called after verification, never on the receive path. It reuses the verifiers' own
parsing rules (ingress/verifiers/common.py), so every body a verifier accepted parses here
the same way: JSON objects, and GitHub's and Slack's form-encoded variants (`payload=<json>`
or plain form fields).
"""

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ingress.encryption import decrypt_body, decrypt_headers
from ingress.verifiers.base import StoredRequest
from ingress.verifiers.common import (
    Reject,
    body_text,
    form_fields,
    form_payload,
    is_form_encoded,
    json_object,
)
from kernel.errors import PermanentError

if TYPE_CHECKING:
    # The model is needed for the type checker only: this module stays importable before
    # the app registry is ready.
    from ingress.models import RawEvent

UNPARSEABLE_BODY = "The body is neither a JSON object nor a form the provider sends."
_NO_TIME = datetime.min.replace(tzinfo=UTC)


class UnparseablePayload(PermanentError):
    permanent_reason = "unparseable_payload"


def raw_event_body(event: "RawEvent") -> bytes:
    """The body as received, decrypted if it is stored encrypted: the one way a body is read.

    Raises ingress.encryption.BodyUndecryptable (payload-free) when the configured keys
    cannot decrypt it. Needs `body` and `body_encryption` loaded (and `id`, for the message).
    An empty stored body is an empty body, encrypted or not (a token is never empty): one
    received empty, or one the rejected-payload cap dropped (ingress/rejected_payloads.py).
    """
    stored = bytes(event.body)
    if not stored:
        return b""
    return decrypt_body(stored, event.body_encryption, raw_event_id=event.id)


def raw_event_headers(event: "RawEvent") -> dict[str, str]:
    """The headers as received, decrypted if stored encrypted (with the body, same key)."""
    return decrypt_headers(event.headers, event.body_encryption, raw_event_id=event.id)


def parse_payload(headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    # received_at plays no part in parsing; the helpers take the stored request as a whole.
    request = StoredRequest(headers=headers, body=body, received_at=_NO_TIME)
    try:
        text = body_text(request)
        if not is_form_encoded(request):
            return json_object(text)
        fields = form_fields(text)
        return form_payload(fields) if "payload" in fields else fields
    except Reject as exc:
        raise UnparseablePayload(UNPARSEABLE_BODY) from exc


# --- text PostgreSQL can store ---------------------------------------------------------------
#
# A PostgreSQL text (or jsonb) value cannot hold U+0000, and psycopg cannot encode a lone
# surrogate (U+D800..U+DFFF on its own) as UTF-8. Neither can arrive as raw bytes in a body
# a verifier accepted (NUL is not allowed unescaped in JSON, surrogates are not UTF-8), but
# JSON escapes ("\u0000", "\ud800") and percent-escapes in forms ("%00") decode to them.

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def holds_unstorable_text(headers: Mapping[str, str], body: bytes) -> bool:
    """Whether the parsed body holds, anywhere (keys too), text PostgreSQL cannot store.

    Costs one substring search for a JSON body without escapes (nearly every body); only a
    body that could hold such text is parsed and walked. A body that does not parse is not
    this check's business (the verifiers reject it), so it answers False.
    """
    if not _may_hold_unstorable_text(headers, body):
        return False
    try:
        return _holds_unstorable(parse_payload(headers, body))
    except UnparseablePayload:
        return False


def storable_text(text: str) -> str:
    """`text` with what PostgreSQL cannot store written as escapes (NUL as \\x00, a lone
    surrogate as \\udXXX): the one sanitiser for text we write that came from elsewhere,
    such as a handler's error message."""
    if not _UNSTORABLE.search(text):
        return text
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _may_hold_unstorable_text(headers: Mapping[str, str], body: bytes) -> bool:
    if is_form_encoded(StoredRequest(headers=headers, body=b"", received_at=_NO_TIME)):
        return True  # percent-escapes can hide anything; forms are rare and small
    return b"\\u" in body


def _holds_unstorable(value: Any) -> bool:
    # Iterative: json.loads accepts nesting deeper than a recursive walk could follow.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
