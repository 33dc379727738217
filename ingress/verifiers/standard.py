"""Standard Webhooks (our render service): `webhook-id`, `webhook-timestamp` and
`webhook-signature: v1,<base64> [v1,<base64> …]` over `<id>.<timestamp>.<body>`.

The signing math is the `standardwebhooks` package's own `Webhook.sign`. Its `verify` is not
used because it judges the timestamp against now (a backlog would turn stale) and raises one
exception type for every failure; the headers are parsed here and the timestamp is judged
against received_at instead. Secrets are `whsec_<base64 key>`: the key is decoded strictly, so
a mistyped secret is skipped and reported instead of being silently read as another key.
Several `v1` entries are allowed (the sender rolling its secret); other schemes, such as the
asymmetric `v1a`, are not checked.
"""

import base64
import hmac
from datetime import datetime

from standardwebhooks.webhooks import Webhook

from ingress.models import RejectionReason
from ingress.verifiers.base import Source, StoredRequest, Verdict
from ingress.verifiers.common import (
    Reject,
    body_text,
    check_timestamp,
    json_only_body,
    required_header,
    returns_verdict,
    signature_header,
    string_field,
    unix_timestamp,
    usable_secrets,
)

TIMESTAMP_HEADER = "webhook-timestamp"
SCHEME = "v1"
KEY_PREFIX = "whsec_"


@returns_verdict
def verify(source: Source, request: StoredRequest) -> Verdict:
    webhooks = usable_secrets(source, _webhook)
    header = signature_header(source, request)
    msg_id = _message_id(source, request)
    signed_at = unix_timestamp(
        required_header(request, TIMESTAMP_HEADER, RejectionReason.MALFORMED_HEADER)
    )
    signatures = _v1_signatures(header)
    # The package signs the body's text, so bytes that are not UTF-8 cannot carry a valid
    # signature at all: they are reported as an unparseable body before any signature check.
    text = body_text(request)
    secret_index = _matching_secret(webhooks, msg_id, signed_at, text, signatures)
    check_timestamp(signed_at, request, source.tolerance_seconds)
    return Verdict(
        secret_index=secret_index,
        event_type=string_field(json_only_body(request, text), "type"),
        provider_event_id=msg_id,
    )


def _webhook(secret: str) -> Webhook:
    key = secret.removeprefix(KEY_PREFIX)
    # validate=True refuses characters outside the alphabet instead of dropping them; the
    # padding is restored because senders often strip it.
    decoded = base64.b64decode(key + "=" * (-len(key) % 4), validate=True)
    if not decoded:
        raise ValueError("empty key")
    return Webhook(decoded)


def _message_id(source: Source, request: StoredRequest) -> str:
    # webhook-id, the provider's delivery id header: it is part of the signed content.
    msg_id = required_header(request, source.delivery_id_header, RejectionReason.MALFORMED_HEADER)
    try:
        msg_id.encode("utf-8")  # it is part of the signed content
    except UnicodeEncodeError as exc:
        raise Reject(RejectionReason.MALFORMED_HEADER) from exc
    return msg_id


def _v1_signatures(header: str) -> list[bytes]:
    signatures: list[bytes] = []
    for entry in header.split():
        scheme, separator, signature = entry.partition(",")
        if not separator:
            raise Reject(RejectionReason.MALFORMED_HEADER)
        if scheme != SCHEME:
            continue
        try:
            signatures.append(base64.b64decode(signature, validate=True))
        except ValueError as exc:  # binascii.Error, or characters that are not ASCII
            raise Reject(RejectionReason.MALFORMED_HEADER) from exc
    if not signatures:
        raise Reject(RejectionReason.NO_MATCHING_SCHEME)
    return signatures


def _matching_secret(
    webhooks: list[tuple[int, Webhook]],
    msg_id: str,
    signed_at: datetime,
    text: str,
    signatures: list[bytes],
) -> int:
    for index, webhook in webhooks:
        _, expected = webhook.sign(msg_id, signed_at, text).split(",", 1)
        expected_bytes = base64.b64decode(expected)
        if any(hmac.compare_digest(expected_bytes, signature) for signature in signatures):
            return index
    raise Reject(RejectionReason.BAD_SIGNATURE)
