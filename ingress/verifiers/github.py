"""GitHub: `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the body with the hook secret.

GitHub signs the body only and sends no timestamp, so nothing bounds a replay in time and the
`X-GitHub-Event` / `X-GitHub-Delivery` headers are not covered by the signature; dedup on the
delivery id is what stops an identical redelivery from running twice. The legacy SHA-1
`X-Hub-Signature` header is deliberately ignored.
"""

from ingress.verifiers.base import Source, StoredRequest, Verdict
from ingress.verifiers.common import (
    body_text,
    form_fields,
    form_payload,
    is_form_encoded,
    json_object,
    match_hex_hmac,
    returns_verdict,
    scheme_hex_signature,
    signature_header,
    usable_secrets,
    utf8_secret,
)

SCHEME = "sha256"


@returns_verdict
def verify(source: Source, request: StoredRequest) -> Verdict:
    keys = usable_secrets(source, utf8_secret)
    header = signature_header(source, request)
    signature = scheme_hex_signature(header, SCHEME)
    secret_index = match_hex_hmac(keys, request.body, [signature])
    _check_payload(request)
    return Verdict(
        secret_index=secret_index,
        event_type=request.headers.get("x-github-event", ""),
        provider_event_id=request.headers.get(source.delivery_id_header, ""),
    )


def _check_payload(request: StoredRequest) -> None:
    # Routing uses the headers, but a verified body must still be the JSON object GitHub
    # sends, so a handler never meets anything else. A hook configured with content type
    # "application/x-www-form-urlencoded" sends the same JSON in a `payload` form field.
    text = body_text(request)
    if is_form_encoded(request):
        form_payload(form_fields(text))
    else:
        json_object(text)
