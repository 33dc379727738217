"""Generic HMAC senders: `<signature_header>: <signature_prefix><hex HMAC-SHA256 of the body>`.

For simple senders that sign the body only, with no timestamp (so, like GitHub, nothing bounds
a replay in time; dedup on the delivery id or the body is the only guard). The header name and
prefix come from the source's configuration.
"""

from ingress.models import RejectionReason
from ingress.verifiers.base import Source, StoredRequest, Verdict
from ingress.verifiers.common import (
    Reject,
    body_text,
    json_only_body,
    match_hex_hmac,
    returns_verdict,
    sha256_hex,
    signature_header,
    string_field,
    usable_secrets,
    utf8_secret,
)


@returns_verdict
def verify(source: Source, request: StoredRequest) -> Verdict:
    keys = usable_secrets(source, utf8_secret)
    header = signature_header(source, request)
    if not header.startswith(source.signature_prefix):
        raise Reject(RejectionReason.NO_MATCHING_SCHEME)
    signature = sha256_hex(header[len(source.signature_prefix) :])
    secret_index = match_hex_hmac(keys, request.body, [signature])
    payload = json_only_body(request, body_text(request))
    delivery_id = request.headers.get(source.delivery_id_header, "")
    return Verdict(
        secret_index=secret_index,
        event_type=string_field(payload, "type"),
        provider_event_id=delivery_id or string_field(payload, "id"),
    )
