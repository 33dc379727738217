"""Stripe: the SDK does the signature math; we parse the header and own the clock."""

import time

import pytest
import stripe

from ingress.verifiers.stripe import verify
from tests.ingress.verifiers.signing import (
    BODIES,
    SECRETS,
    SIGNED_AT,
    TOLERANCE,
    hex_hmac,
    make_request,
    make_source,
    stripe_headers,
)

SECRET = SECRETS["stripe"][0]
SOURCE = make_source("stripe", SECRET)
BODY = BODIES["stripe"]
V1 = stripe.WebhookSignature._compute_signature(f"{SIGNED_AT}.{BODY.decode()}", SECRET)
OTHER_HEX = "0" * 64


def check(header: str | None, body: bytes = BODY) -> str:
    headers = {} if header is None else {"stripe-signature": header}
    return verify(SOURCE, make_request(headers, body)).reason


def test_sdk_generated_header_is_verified():
    verdict = verify(SOURCE, make_request(stripe_headers(BODY, SECRET), BODY))
    assert verdict.ok
    assert verdict.event_type == "checkout.session.completed"
    assert verdict.provider_event_id == "evt_1PxYz"
    assert verdict.secret_index == 0


def test_any_matching_v1_is_accepted_like_the_sdk_does():
    # Stripe signs with two secrets while the endpoint secret is being rolled on its side.
    assert check(f"t={SIGNED_AT},v1={OTHER_HEX},v1={V1},v0={OTHER_HEX}") == ""


def test_v0_alone_is_no_matching_scheme_even_when_it_would_match():
    assert check(f"t={SIGNED_AT},v0={V1}") == "no_matching_scheme"


def test_whsec_secret_is_the_key_as_it_stands_not_base64():
    manual = hex_hmac(SECRET, f"{SIGNED_AT}.".encode() + BODY)
    assert manual == V1
    assert check(f"t={SIGNED_AT},v1={manual}") == ""


def test_the_sdk_alone_would_accept_a_future_timestamp_we_do_not():
    future = int(time.time()) + 3600
    header = stripe_headers(BODY, SECRET, future)["stripe-signature"]
    assert stripe.WebhookSignature.verify_header(BODY, header, SECRET, tolerance=TOLERANCE)
    assert check(header) == "future_timestamp"


def test_the_sdk_clock_check_is_not_used():
    # SIGNED_AT is long past by wall clock; the SDK with a tolerance would reject it.
    header = f"t={SIGNED_AT},v1={V1}"
    with pytest.raises(stripe.SignatureVerificationError):
        stripe.WebhookSignature.verify_header(BODY, header, SECRET, tolerance=TOLERANCE)
    assert check(header) == ""


@pytest.mark.parametrize(
    ("header", "body", "reason"),
    [
        pytest.param(None, BODY, "missing_signature", id="no-header"),
        pytest.param("", BODY, "missing_signature", id="empty-header"),
        pytest.param("garbage", BODY, "malformed_header", id="no-key-value"),
        pytest.param(f"v1={V1}", BODY, "malformed_header", id="no-timestamp"),
        pytest.param(f"t=,v1={V1}", BODY, "malformed_header", id="empty-timestamp"),
        pytest.param(f"t=abc,v1={V1}", BODY, "malformed_header", id="text-timestamp"),
        pytest.param(f"t=1.5,v1={V1}", BODY, "malformed_header", id="fractional-timestamp"),
        pytest.param(f"t=-5,v1={V1}", BODY, "malformed_header", id="negative-timestamp"),
        pytest.param(f"t=1_700_000_000,v1={V1}", BODY, "malformed_header", id="int-underscores"),
        pytest.param(f"t=9{'9' * 20},v1={V1}", BODY, "malformed_header", id="huge-timestamp"),
        pytest.param(
            f"t={SIGNED_AT},t={SIGNED_AT + 1},v1={V1}", BODY, "malformed_header", id="two-t"
        ),
        pytest.param(f"t={SIGNED_AT},v1={V1},", BODY, "malformed_header", id="trailing-comma"),
        pytest.param(f"t={SIGNED_AT},v1=xyz", BODY, "malformed_header", id="v1-not-hex"),
        pytest.param(f"t={SIGNED_AT},v1=", BODY, "malformed_header", id="v1-empty"),
        pytest.param(f"t={SIGNED_AT}", BODY, "no_matching_scheme", id="only-timestamp"),
        pytest.param(f"t={SIGNED_AT}, v1={V1}", BODY, "no_matching_scheme", id="space-before-v1"),
        pytest.param(f"t={SIGNED_AT},v2={V1}", BODY, "no_matching_scheme", id="unknown-scheme"),
        pytest.param(f"t={SIGNED_AT},v1={OTHER_HEX}", BODY, "bad_signature", id="mismatch"),
        pytest.param(f"t={SIGNED_AT + 1},v1={V1}", BODY, "bad_signature", id="other-timestamp"),
        pytest.param(f"t={SIGNED_AT},v1={V1}", BODY + b" ", "bad_signature", id="body-changed"),
        pytest.param(f"t={SIGNED_AT},v1={V1.upper()}", BODY, "bad_signature", id="upper-hex"),
        pytest.param(f"t={SIGNED_AT},v1={V1}", b"\xff\xfe", "unparseable_body", id="not-utf8"),
    ],
)
def test_malformed_inputs(header, body, reason):
    assert check(header, body) == reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(b"[1, 2]", "unparseable_body", id="json-array"),
        pytest.param(b'"evt"', "unparseable_body", id="json-string"),
        pytest.param(b"{", "unparseable_body", id="truncated-json"),
        pytest.param(b"", "unparseable_body", id="empty-body"),
        pytest.param(b"[" * 100_000, "unparseable_body", id="deep-nesting"),
        pytest.param(b"1" * 5000, "unparseable_body", id="int-over-digit-limit"),
        pytest.param(b'{"id": 5, "type": ["x"]}', "", id="odd-fields-are-empty-strings"),
    ],
)
def test_validly_signed_bodies_that_are_not_a_stripe_event_object(body, reason):
    verdict = verify(SOURCE, make_request(stripe_headers(body, SECRET), body))
    assert verdict.reason == reason
    if verdict.ok:
        assert (verdict.event_type, verdict.provider_event_id) == ("", "")


def test_a_form_content_type_is_not_what_stripe_sends():
    headers = stripe_headers(BODY, SECRET) | {"content-type": "application/x-www-form-urlencoded"}
    assert verify(SOURCE, make_request(headers, BODY)).reason == "unparseable_body"
