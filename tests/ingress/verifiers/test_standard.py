"""Standard Webhooks: the package's `sign` does the math; headers and clock are ours."""

import base64
import logging
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from ingress.verifiers.standard import verify
from tests.ingress.verifiers.signing import (
    BODIES,
    SECRETS,
    SIGNED_AT,
    make_request,
    make_source,
    standard_headers,
)

SECRET = SECRETS["standard"][0]
SOURCE = make_source("standard", SECRET)
BODY = BODIES["standard"]

# The example in the Standard Webhooks specification (and its reference libraries' tests).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def spec_request(signature: str = SPEC_SIGNATURE):
    headers = {
        "webhook-id": SPEC_ID,
        "webhook-timestamp": str(SPEC_TIMESTAMP),
        "webhook-signature": signature,
    }
    return make_request(headers, SPEC_BODY, datetime.fromtimestamp(SPEC_TIMESTAMP, tz=UTC))


def test_specification_example_is_verified():
    verdict = verify(make_source("standard", SPEC_SECRET), spec_request())
    assert verdict.ok, verdict.reason
    assert verdict.provider_event_id == SPEC_ID
    assert verdict.event_type == ""  # the example body has no `type`


def test_library_signed_event_is_verified():
    verdict = verify(SOURCE, make_request(standard_headers(BODY, SECRET), BODY))
    assert verdict.ok
    assert verdict.event_type == "recap.rendered"
    assert verdict.provider_event_id == "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"


def test_the_library_verify_would_reject_a_backlog_we_accept():
    headers = standard_headers(BODY, SECRET)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(BODY, headers)
    assert verify(SOURCE, make_request(headers, BODY)).ok


def test_several_v1_entries_and_other_schemes_are_tolerated():
    signature = f"v1a,c29tZXRoaW5n v1,{base64.b64encode(b'x' * 32).decode()}  {SPEC_SIGNATURE}"
    assert verify(make_source("standard", SPEC_SECRET), spec_request(signature)).ok


def test_secret_without_prefix_and_without_padding_is_accepted():
    bare = SECRETS["standard"][1].removeprefix("whsec_").rstrip("=")
    source = make_source("standard", bare)
    request = make_request(standard_headers(BODY, SECRETS["standard"][1]), BODY)
    assert verify(source, request).ok


def test_undecodable_secret_is_skipped_and_never_logged(caplog):
    # "!" is outside the base64 alphabet; the package itself would quietly drop it and use a
    # different key, so a typo would look like a sender problem.
    typo = SECRET.replace("Mf", "M!f")
    caplog.set_level(logging.WARNING, logger="ingress.verifiers.common")
    request = make_request(standard_headers(BODY, SECRET), BODY)
    verdict = verify(make_source("standard", typo, SECRET), request)
    assert verdict.ok
    assert verdict.secret_index == 1
    assert [(r.message, r.secret_index) for r in caplog.records] == [
        ("ingress.verify.unusable_secret", 0)
    ]
    assert typo not in caplog.text
    assert verify(make_source("standard", typo), request).reason == "no_secret_configured"


def test_empty_key_is_unusable():
    assert verify(make_source("standard", "whsec_"), spec_request()).reason == (
        "no_secret_configured"
    )


GOOD = standard_headers(BODY, SECRET)
GOOD_V1 = GOOD["webhook-signature"]


def without(name: str) -> dict[str, str]:
    return {k: v for k, v in GOOD.items() if k != name}


@pytest.mark.parametrize(
    ("headers", "body", "reason"),
    [
        pytest.param(without("webhook-signature"), BODY, "missing_signature", id="no-signature"),
        pytest.param(without("webhook-id"), BODY, "malformed_header", id="no-id"),
        pytest.param(without("webhook-timestamp"), BODY, "malformed_header", id="no-timestamp"),
        pytest.param(
            GOOD | {"webhook-timestamp": "1.5"}, BODY, "malformed_header", id="fractional-ts"
        ),
        pytest.param(
            GOOD | {"webhook-timestamp": "9" * 12}, BODY, "malformed_header", id="year-beyond-9999"
        ),
        pytest.param(
            GOOD | {"webhook-id": "msg_\udcff"}, BODY, "malformed_header", id="id-not-encodable"
        ),
        pytest.param(
            GOOD | {"webhook-signature": "v1"}, BODY, "malformed_header", id="entry-without-comma"
        ),
        pytest.param(
            GOOD | {"webhook-signature": "v1,***"}, BODY, "malformed_header", id="bad-base64"
        ),
        pytest.param(
            GOOD | {"webhook-signature": "v1,é"}, BODY, "malformed_header", id="non-ascii-base64"
        ),
        pytest.param(
            GOOD | {"webhook-signature": f"{GOOD_V1} v1,***"},
            BODY,
            "malformed_header",
            id="one-bad-entry",
        ),
        pytest.param(
            GOOD | {"webhook-signature": "v1a,c29tZXRoaW5n"},
            BODY,
            "no_matching_scheme",
            id="only-v1a",
        ),
        pytest.param(
            GOOD | {"webhook-signature": "v2" + GOOD_V1[2:]},
            BODY,
            "no_matching_scheme",
            id="v2-with-a-valid-signature",
        ),
        pytest.param(
            GOOD | {"webhook-signature": "v1,"}, BODY, "bad_signature", id="empty-signature"
        ),
        pytest.param(GOOD | {"webhook-id": "msg_other"}, BODY, "bad_signature", id="id-swapped"),
        pytest.param(
            GOOD | {"webhook-timestamp": str(SIGNED_AT - 1)},
            BODY,
            "bad_signature",
            id="timestamp-swapped",
        ),
        pytest.param(GOOD, BODY[:-1], "bad_signature", id="body-changed"),
        pytest.param(GOOD, b"\xff" + BODY, "unparseable_body", id="not-utf8"),
        pytest.param(
            GOOD | {"content-type": "application/x-www-form-urlencoded"},
            BODY,
            "unparseable_body",
            id="form-content-type",
        ),
        pytest.param(standard_headers(b"[]", SECRET), b"[]", "unparseable_body", id="json-array"),
        pytest.param(standard_headers(b"{}", SECRET), b"{}", "", id="object-without-type-is-fine"),
    ],
)
def test_malformed_inputs(headers, body, reason):
    assert verify(SOURCE, make_request(headers, body)).reason == reason
