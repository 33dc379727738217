"""Generic HMAC: configured header and prefix, hex HMAC-SHA256 of the body, JSON object body."""

from dataclasses import replace

import pytest

from ingress.verifiers.hmac import verify
from tests.ingress.verifiers.signing import SECRETS, hex_hmac, make_request, make_source

SECRET = SECRETS["hmac"][0]
SOURCE = make_source("hmac", SECRET)
BODY = b'{"type": "order.created", "id": "ord_1"}'
HEX = hex_hmac(SECRET, BODY)


def signed(body: bytes, **extra: str) -> dict[str, str]:
    return {"x-signature": "sha256=" + hex_hmac(SECRET, body)} | extra


def test_same_configuration_as_github_verifies_githubs_documented_signature():
    source = replace(
        make_source("hmac", "It's a Secret to Everybody"),
        signature_header="x-hub-signature-256",
    )
    header = {
        "x-hub-signature-256": (
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        )
    }
    # Not a JSON object: the signature passed, the body check decided.
    assert verify(source, make_request(header, b"Hello, World!")).reason == "unparseable_body"
    assert verify(source, make_request(header, b"Hello, World?")).reason == "bad_signature"


def test_signed_body_routes_on_type_and_id():
    verdict = verify(SOURCE, make_request(signed(BODY), BODY))
    assert (verdict.reason, verdict.event_type, verdict.provider_event_id) == (
        "",
        "order.created",
        "ord_1",
    )


def test_upper_case_hex_is_accepted():
    assert verify(SOURCE, make_request({"x-signature": "sha256=" + HEX.upper()}, BODY)).ok


def test_empty_prefix_means_the_bare_digest():
    source = replace(SOURCE, signature_prefix="")
    assert verify(source, make_request({"x-signature": HEX}, BODY)).ok


@pytest.mark.parametrize(
    ("delivery_id_header", "headers", "body", "event_id"),
    [
        ("x-delivery", {"x-delivery": "dlv_9"}, BODY, "dlv_9"),
        ("x-delivery", {}, BODY, "ord_1"),
        ("", {"x-delivery": "dlv_9"}, BODY, "ord_1"),
        ("", {}, b'{"id": 17, "type": 3}', ""),
        ("", {}, b"{}", ""),
    ],
)
def test_provider_event_id_prefers_the_delivery_header_then_the_body_id(
    delivery_id_header, headers, body, event_id
):
    source = replace(SOURCE, delivery_id_header=delivery_id_header)
    verdict = verify(source, make_request(signed(body, **headers), body))
    assert verdict.ok
    assert verdict.provider_event_id == event_id


def test_non_string_type_routes_nowhere():
    body = b'{"type": ["order.created"]}'
    assert verify(SOURCE, make_request(signed(body), body)).event_type == ""


@pytest.mark.parametrize(
    ("headers", "body", "reason"),
    [
        pytest.param({}, BODY, "missing_signature", id="no-header"),
        pytest.param({"x-other": "sha256=" + HEX}, BODY, "missing_signature", id="other-header"),
        pytest.param({"x-signature": ""}, BODY, "missing_signature", id="empty"),
        pytest.param({"x-signature": HEX}, BODY, "no_matching_scheme", id="no-prefix"),
        pytest.param({"x-signature": "sha1=" + HEX}, BODY, "no_matching_scheme", id="sha1"),
        pytest.param({"x-signature": "sha256="}, BODY, "malformed_header", id="empty-hex"),
        pytest.param({"x-signature": "sha256=" + HEX + "0"}, BODY, "malformed_header", id="65"),
        pytest.param(
            {"x-signature": "sha256= " + HEX[1:]}, BODY, "malformed_header", id="space-in-hex"
        ),
        pytest.param({"x-signature": "sha256=" + "0" * 64}, BODY, "bad_signature", id="mismatch"),
        pytest.param(signed(BODY), BODY + b"\n", "bad_signature", id="body-changed"),
        pytest.param(signed(b"\x80"), b"\x80", "unparseable_body", id="not-utf8"),
        pytest.param(signed(b"[]"), b"[]", "unparseable_body", id="json-array"),
        pytest.param(signed(b""), b"", "unparseable_body", id="empty-body"),
        pytest.param(signed(b"NaN"), b"NaN", "unparseable_body", id="json-number"),
        pytest.param(
            signed(BODY, **{"content-type": "application/x-www-form-urlencoded"}),
            BODY,
            "unparseable_body",
            id="json-sent-as-form",  # curl -d without -H content-type
        ),
    ],
)
def test_malformed_inputs(headers, body, reason):
    assert verify(SOURCE, make_request(headers, body)).reason == reason


def test_unset_signature_header_is_missing_signature():
    source = replace(SOURCE, signature_header="")
    assert verify(source, make_request(signed(BODY), BODY)).reason == "missing_signature"
