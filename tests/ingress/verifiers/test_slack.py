"""Slack: v0 HMAC over `v0:<timestamp>:<body>`, three body kinds, retry hints recorded."""

import json
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest

from ingress.verifiers.slack import verify
from tests.ingress.verifiers.signing import (
    BODIES,
    SECRETS,
    SIGNED_AT,
    hex_hmac,
    make_request,
    make_source,
    slack_headers,
)

SECRET = SECRETS["slack"][0]
SOURCE = make_source("slack", SECRET)
FORM = "application/x-www-form-urlencoded"

# https://api.slack.com/authentication/verifying-requests-from-slack
DOC_TIMESTAMP = 1531420618
DOC_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow"
    b"&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner"
    b"&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2F"
    b"commands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
    b"&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
DOC_SIGNATURE = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
DOC_HEADERS = {
    "x-slack-signature": DOC_SIGNATURE,
    "x-slack-request-timestamp": str(DOC_TIMESTAMP),
    "content-type": FORM,
}
DOC_RECEIVED_AT = datetime.fromtimestamp(DOC_TIMESTAMP + 1, tz=UTC)


def signed(body: bytes, content_type: str = "application/json", **extra: str) -> dict[str, str]:
    return slack_headers(body, SECRET) | {"content-type": content_type} | extra


def run(headers: dict[str, str], body: bytes):
    return verify(SOURCE, make_request(headers, body))


def test_documentation_example_is_a_verified_slash_command():
    verdict = verify(SOURCE, make_request(DOC_HEADERS, DOC_BODY, DOC_RECEIVED_AT))
    assert verdict.ok, verdict.reason
    assert verdict.event_type == "slash_command"
    assert verdict.provider_event_id == ""
    assert verdict.handshake_challenge is None


def test_documentation_example_with_one_byte_changed_is_bad_signature():
    tampered = DOC_BODY.replace(b"roadrunner", b"roadrunnex")
    assert verify(SOURCE, make_request(DOC_HEADERS, tampered, DOC_RECEIVED_AT)).reason == (
        "bad_signature"
    )


URL_VERIFICATION = json.dumps(
    {"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": "3eZbrw1aBm2rZ", "type": "url_verification"}
).encode()


def test_url_verification_yields_the_challenge_when_signed():
    verdict = run(signed(URL_VERIFICATION), URL_VERIFICATION)
    assert verdict.ok
    assert verdict.event_type == "url_verification"
    assert verdict.handshake_challenge == "3eZbrw1aBm2rZ"


def test_url_verification_with_a_bad_signature_yields_no_challenge():
    headers = signed(URL_VERIFICATION) | {"x-slack-signature": "v0=" + "0" * 64}
    verdict = run(headers, URL_VERIFICATION)
    assert verdict.reason == "bad_signature"
    assert verdict.handshake_challenge is None


def test_event_callback_routes_on_the_inner_event_type_and_dedups_on_event_id():
    body = BODIES["slack"]
    verdict = run(signed(body), body)
    assert (verdict.reason, verdict.event_type, verdict.provider_event_id) == (
        "",
        "app_mention",
        "Ev08MFMKH6",
    )


def test_other_events_api_types_route_on_their_type():
    body = b'{"type": "app_rate_limited", "team_id": "T1", "minute_rate_limited": 1518467820}'
    assert run(signed(body), body).event_type == "app_rate_limited"


def test_interactivity_payload_routes_on_its_type():
    body = urlencode({"payload": json.dumps({"type": "block_actions", "actions": []})}).encode()
    verdict = run(signed(body, FORM), body)
    assert verdict.ok
    assert verdict.event_type == "block_actions"


@pytest.mark.parametrize(
    ("retry_num", "retry_reason", "expected_num", "expected_reason"),
    [
        ("1", "http_timeout", 1, "http_timeout"),
        ("3", "http_error", 3, "http_error"),
        ("abc", "http_timeout", None, "http_timeout"),
        ("-1", "", None, ""),
        ("1.0", "", None, ""),
        ("99999", "", None, ""),
        ("", "x" * 100, None, "x" * 100),  # the worker fits it to its column
    ],
)
def test_retry_hints_are_recorded_and_never_reject(
    retry_num, retry_reason, expected_num, expected_reason
):
    body = BODIES["slack"]
    headers = signed(body, **{"x-slack-retry-num": retry_num, "x-slack-retry-reason": retry_reason})
    verdict = run(headers, body)
    assert verdict.ok
    assert (verdict.provider_retry_num, verdict.provider_retry_reason) == (
        expected_num,
        expected_reason,
    )


def test_the_timestamp_is_signed_exactly_as_sent():
    # Leading zeros are part of the signed string; the header is not normalised first.
    body = BODIES["slack"]
    timestamp = f"0{SIGNED_AT}"
    headers = {
        "x-slack-request-timestamp": timestamp,
        "x-slack-signature": "v0=" + hex_hmac(SECRET, f"v0:{timestamp}:".encode() + body),
    }
    assert run(headers, body).ok
    headers["x-slack-request-timestamp"] = str(SIGNED_AT)
    assert run(headers, body).reason == "bad_signature"


BODY = BODIES["slack"]
GOOD = signed(BODY)
GOOD_HEX = GOOD["x-slack-signature"].removeprefix("v0=")


def without(name: str) -> dict[str, str]:
    return {k: v for k, v in GOOD.items() if k != name}


@pytest.mark.parametrize(
    ("headers", "body", "reason"),
    [
        pytest.param(without("x-slack-signature"), BODY, "missing_signature", id="no-signature"),
        pytest.param({}, BODY, "missing_signature", id="no-headers"),
        pytest.param(
            without("x-slack-request-timestamp"), BODY, "malformed_header", id="no-timestamp"
        ),
        pytest.param(
            GOOD | {"x-slack-request-timestamp": ""}, BODY, "malformed_header", id="empty-ts"
        ),
        pytest.param(
            GOOD | {"x-slack-request-timestamp": "soon"}, BODY, "malformed_header", id="text-ts"
        ),
        pytest.param(
            GOOD | {"x-slack-request-timestamp": f" {SIGNED_AT}"},
            BODY,
            "malformed_header",
            id="padded-ts",
        ),
        pytest.param(
            GOOD | {"x-slack-request-timestamp": "1e9"}, BODY, "malformed_header", id="exp-ts"
        ),
        pytest.param(
            GOOD | {"x-slack-signature": GOOD_HEX}, BODY, "malformed_header", id="no-version"
        ),
        pytest.param(
            GOOD | {"x-slack-signature": "v1=" + GOOD_HEX},
            BODY,
            "no_matching_scheme",
            id="other-version",
        ),
        pytest.param(GOOD | {"x-slack-signature": "v0="}, BODY, "malformed_header", id="empty"),
        pytest.param(
            GOOD | {"x-slack-signature": "v0=" + "z" * 64}, BODY, "malformed_header", id="not-hex"
        ),
        pytest.param(
            GOOD | {"x-slack-signature": "v0=" + "0" * 64}, BODY, "bad_signature", id="mismatch"
        ),
        pytest.param(
            GOOD | {"x-slack-request-timestamp": str(SIGNED_AT + 1)},
            BODY,
            "bad_signature",
            id="timestamp-swapped",
        ),
        pytest.param(GOOD, BODY + b" ", "bad_signature", id="body-changed"),
        pytest.param(signed(b"\xc3\x28"), b"\xc3\x28", "unparseable_body", id="not-utf8"),
        pytest.param(signed(b"[]"), b"[]", "unparseable_body", id="json-array"),
        pytest.param(signed(b"token=x", FORM), b"token=x", "unparseable_body", id="form-unknown"),
        pytest.param(
            signed(b"payload=%5B%5D", FORM), b"payload=%5B%5D", "unparseable_body", id="form-list"
        ),
        pytest.param(
            signed(b"command=/a&command=/b", FORM),
            b"command=/a&command=/b",
            "unparseable_body",
            id="form-field-twice",
        ),
    ],
)
def test_malformed_inputs(headers, body, reason):
    assert run(headers, body).reason == reason
