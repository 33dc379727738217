"""Stripe: `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…][,v0=<hex>]`, checked by the SDK.

The signature math is the `stripe` SDK's own (`WebhookSignature.verify_header`), so a change
on Stripe's side arrives with an SDK upgrade. Its quirks, and what we do about them:

- It raises one exception type for every failure, so the header is parsed here first to tell
  malformed, no-v1 and mismatch apart; this parse is at least as strict as the SDK's, so an
  SDK failure after it can only mean a mismatch.
- It accepts any matching `v1` (Stripe signs with old and new secret while *it* rolls one)
  and ignores `v0` (a fake signature Stripe adds to test-mode events): a header with only
  `v0` has no matching scheme.
- It checks the timestamp against time.time() and never rejects one from the future. We call
  it with tolerance=None, which skips that check, and judge the timestamp against received_at
  in both directions ourselves.
- `whsec_…` secrets are HMAC keys as they stand (unlike Standard Webhooks, not base64).
"""

from datetime import datetime

import stripe

from ingress.models import RejectionReason
from ingress.verifiers.base import Source, StoredRequest, Verdict
from ingress.verifiers.common import (
    Reject,
    body_text,
    check_timestamp,
    json_only_body,
    returns_verdict,
    sha256_hex,
    signature_header,
    string_field,
    unix_timestamp,
    usable_secrets,
    utf8_secret,
)


@returns_verdict
def verify(source: Source, request: StoredRequest) -> Verdict:
    keys = usable_secrets(source, _stripe_secret)
    header = signature_header(source, request)
    signed_at = _parse_header(header)
    # The SDK signs the body's text, so bytes that are not UTF-8 cannot carry a Stripe
    # signature at all: they are reported as an unparseable body before any signature check.
    text = body_text(request)
    secret_index = _matching_secret(keys, text, header)
    check_timestamp(signed_at, request, source.tolerance_seconds)
    event = json_only_body(request, text)
    return Verdict(
        secret_index=secret_index,
        event_type=string_field(event, "type"),
        provider_event_id=string_field(event, "id"),
    )


def _stripe_secret(secret: str) -> str:
    utf8_secret(secret)  # the SDK would raise on a blank or unencodable one mid-loop
    return secret


def _parse_header(header: str) -> datetime:
    """The signed timestamp; rejects what the SDK could not parse or would read ambiguously."""
    timestamps: list[str] = []
    signatures: list[str] = []
    for item in header.split(","):
        key, separator, value = item.partition("=")
        if not separator:
            raise Reject(RejectionReason.MALFORMED_HEADER)
        if key == "t":
            timestamps.append(value)
        elif key == stripe.WebhookSignature.EXPECTED_SCHEME:
            signatures.append(sha256_hex(value))
    # The SDK silently takes the first of several `t=`; a header like that is not Stripe's.
    if len(timestamps) != 1:
        raise Reject(RejectionReason.MALFORMED_HEADER)
    signed_at = unix_timestamp(timestamps[0])
    if not signatures:
        raise Reject(RejectionReason.NO_MATCHING_SCHEME)
    return signed_at


def _matching_secret(keys: list[tuple[int, str]], text: str, header: str) -> int:
    for index, secret in keys:
        try:
            stripe.WebhookSignature.verify_header(text, header, secret, tolerance=None)
        except stripe.SignatureVerificationError:
            continue
        return index
    raise Reject(RejectionReason.BAD_SIGNATURE)
