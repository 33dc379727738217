"""GitHub: HMAC-SHA256 of the body, no timestamp, JSON or form-encoded `payload=`."""

from urllib.parse import urlencode

import pytest

from ingress.verifiers.github import verify
from tests.ingress.verifiers.signing import (
    BODIES,
    SECRETS,
    github_headers,
    hex_hmac,
    make_request,
    make_source,
)

SECRET = SECRETS["github"][0]
SOURCE = make_source("github", SECRET)
BODY = BODIES["github"]
# https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
DOC_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def check(headers: dict[str, str], body: bytes) -> str:
    return verify(SOURCE, make_request(headers, body)).reason


def test_documentation_vector_signature_matches():
    # GitHub's example payload is not JSON: getting past the signature to the body check
    # (instead of bad_signature) is what shows the documented signature verifies.
    assert check({"x-hub-signature-256": DOC_SIGNATURE}, b"Hello, World!") == "unparseable_body"
    assert check({"x-hub-signature-256": DOC_SIGNATURE}, b"Hello, World?") == "bad_signature"


def test_documentation_signature_in_upper_case_hex_is_accepted():
    header = "sha256=" + DOC_SIGNATURE.removeprefix("sha256=").upper()
    assert check({"x-hub-signature-256": header}, b"Hello, World!") == "unparseable_body"


def test_ping_is_a_normal_event():
    verdict = verify(SOURCE, make_request(github_headers(BODY, SECRET), BODY))
    assert verdict.ok
    assert verdict.event_type == "ping"
    assert verdict.provider_event_id == "72d3162e-cc78-11e3-81ab-4c9367dc0958"


def test_form_encoded_payload_is_supported():
    body = urlencode({"payload": '{"action": "opened", "number": 1}'}).encode()
    headers = github_headers(body, SECRET) | {"x-github-event": "pull_request"}
    headers["content-type"] = "application/x-www-form-urlencoded"
    verdict = verify(SOURCE, make_request(headers, body))
    assert verdict.ok, verdict.reason
    assert verdict.event_type == "pull_request"


def test_missing_event_and_delivery_headers_give_empty_routing_fields():
    headers = {"x-hub-signature-256": "sha256=" + hex_hmac(SECRET, BODY)}
    verdict = verify(SOURCE, make_request(headers, BODY))
    assert verdict.ok
    assert (verdict.event_type, verdict.provider_event_id) == ("", "")


def signed(body: bytes, content_type: str = "application/json") -> dict[str, str]:
    return {"x-hub-signature-256": "sha256=" + hex_hmac(SECRET, body), "content-type": content_type}


FORM = "application/x-www-form-urlencoded"
GOOD_HEX = hex_hmac(SECRET, BODY)


@pytest.mark.parametrize(
    ("headers", "body", "reason"),
    [
        pytest.param({}, BODY, "missing_signature", id="no-header"),
        pytest.param({"x-hub-signature-256": ""}, BODY, "missing_signature", id="empty"),
        pytest.param(
            {"x-hub-signature": "sha1=" + "0" * 40}, BODY, "missing_signature", id="sha1-only"
        ),
        pytest.param({"x-hub-signature-256": GOOD_HEX}, BODY, "malformed_header", id="no-scheme"),
        pytest.param(
            {"x-hub-signature-256": "sha1=" + GOOD_HEX}, BODY, "no_matching_scheme", id="sha1"
        ),
        pytest.param(
            {"x-hub-signature-256": "SHA256=" + GOOD_HEX}, BODY, "no_matching_scheme", id="case"
        ),
        pytest.param({"x-hub-signature-256": "sha256="}, BODY, "malformed_header", id="empty-hex"),
        pytest.param(
            {"x-hub-signature-256": "sha256=" + GOOD_HEX[:-1]}, BODY, "malformed_header", id="63"
        ),
        pytest.param(
            {"x-hub-signature-256": "sha256=" + "g" * 64}, BODY, "malformed_header", id="not-hex"
        ),
        pytest.param(
            {"x-hub-signature-256": "sha256=" + "0" * 64}, BODY, "bad_signature", id="mismatch"
        ),
        pytest.param(signed(BODY), BODY + b"\n", "bad_signature", id="body-changed"),
        pytest.param(signed(b"\xff"), b"\xff", "unparseable_body", id="not-utf8"),
        pytest.param(signed(b"\xff"), b"\xfe", "bad_signature", id="not-utf8-forged"),
        pytest.param(signed(b"[]"), b"[]", "unparseable_body", id="json-array"),
        pytest.param(signed(b"null"), b"null", "unparseable_body", id="json-null"),
        pytest.param(signed(b"a=1", FORM), b"a=1", "unparseable_body", id="form-no-payload"),
        pytest.param(
            signed(b"payload=%7B", FORM), b"payload=%7B", "unparseable_body", id="form-bad-json"
        ),
        pytest.param(
            signed(b"payload=%FF", FORM), b"payload=%FF", "unparseable_body", id="form-not-utf8"
        ),
        pytest.param(
            signed(b"payload={}&payload={}", FORM),
            b"payload={}&payload={}",
            "unparseable_body",
            id="form-payload-twice",
        ),
        pytest.param(signed(b"payload={}", FORM), b"payload={}", "", id="form-ok"),
        pytest.param(
            signed(b"payload={}", "Application/X-WWW-Form-Urlencoded; charset=utf-8"),
            b"payload={}",
            "",
            id="form-content-type-params",
        ),
    ],
)
def test_malformed_inputs(headers, body, reason):
    assert check(headers, body) == reason
