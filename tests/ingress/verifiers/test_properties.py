"""No input makes a verifier raise: arbitrary headers and bodies always end in a Verdict.

The verifiers are called directly (the provider table's `verify` field), not through
ingress.providers.verify, whose catch-all would hide an exception as `verifier_error`.
"""

import json
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingress.models import RejectionReason
from ingress.payloads import parse_payload
from ingress.providers import PROVIDERS as PROVIDERS_TABLE
from ingress.verifiers.base import StoredRequest, Verdict
from tests.ingress.verifiers.signing import (
    PROVIDERS,
    SECRETS,
    SIGNED_AT,
    SIGNERS,
    make_request,
    make_source,
)

HEADER_NAMES = [
    "stripe-signature",
    "x-hub-signature-256",
    "x-github-event",
    "x-github-delivery",
    "x-slack-signature",
    "x-slack-request-timestamp",
    "x-slack-retry-num",
    "x-slack-retry-reason",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "x-signature",
    "content-type",
]

hex64 = st.text(alphabet="0123456789abcdefABCDEF", min_size=63, max_size=65)
timestamps = st.one_of(
    st.integers(min_value=-1, max_value=10**14).map(str),
    st.just(str(SIGNED_AT)),
)
# Values shaped like the real ones, so the fuzzing gets past the first checks.
near_valid = st.one_of(
    st.builds(lambda t, s: f"t={t},v1={s}", timestamps, hex64),
    st.builds(lambda t, s: f"t={t},v0={s},v1={s}", timestamps, hex64),
    st.builds(lambda s: f"sha256={s}", hex64),
    st.builds(lambda s: f"v0={s}", hex64),
    st.builds(lambda s: f"v1,{s}", st.text(max_size=50)),
    st.builds(lambda s: f"v1a,{s} v1,{s}", st.text(max_size=50)),
    timestamps,
    st.sampled_from(["application/json", "application/x-www-form-urlencoded", ""]),
)
header_values = st.one_of(st.text(max_size=80), near_valid)
headers = st.dictionaries(
    keys=st.one_of(st.sampled_from(HEADER_NAMES), st.text(max_size=20)),
    values=header_values,
    max_size=8,
)
bodies = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.sampled_from([b"{}", b"[]", b"payload=%7B%7D", b"command=/x", b'{"type": 1}']),
)
secrets = st.one_of(
    st.sampled_from([secret for pair in SECRETS.values() for secret in pair]),
    st.text(max_size=40),
)
received_at = st.datetimes(
    min_value=datetime(1970, 1, 2),  # noqa: DTZ001 - hypothesis wants naive bounds
    max_value=datetime(9999, 12, 30),  # noqa: DTZ001
    timezones=st.just(UTC),
)


@pytest.mark.parametrize("provider", PROVIDERS)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    headers=headers,
    body=bodies,
    source_secrets=st.lists(secrets, min_size=1, max_size=3),
    received_at=received_at,
)
def test_arbitrary_input_ends_in_a_known_verdict(
    provider, headers, body, source_secrets, received_at
):
    verify = PROVIDERS_TABLE[provider].verify
    source = make_source(provider, *source_secrets)
    verdict = verify(source, StoredRequest(headers=headers, body=body, received_at=received_at))
    assert isinstance(verdict, Verdict)
    assert verdict.reason in [*RejectionReason.values, ""]
    assert verdict.ok == (verdict.secret_index is not None)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
form_bodies = st.dictionaries(
    st.sampled_from(["payload", "command", "text", "token"]),
    st.one_of(json_values.map(json.dumps), st.text(max_size=20)),
    min_size=1,
    max_size=4,
).map(urlencode)
signed_bodies = st.one_of(json_values.map(json.dumps), form_bodies, st.text(max_size=60))


@pytest.mark.parametrize("provider", PROVIDERS)
@settings(max_examples=40, deadline=None)
@given(text=signed_bodies, form=st.booleans())
def test_every_verified_body_is_one_the_handlers_can_parse(provider, text, form):
    # Handlers get their dict from ingress.payloads.parse_payload; a body the verifier lets
    # through and the handler path then refuses would be retried until dead.
    body = text.encode()
    headers = SIGNERS[provider](body, SECRETS[provider][0])
    headers["content-type"] = "application/x-www-form-urlencoded" if form else "application/json"
    verify = PROVIDERS_TABLE[provider].verify
    verdict = verify(make_source(provider, SECRETS[provider][0]), make_request(headers, body))
    if verdict.ok:
        assert isinstance(parse_payload(headers, body), dict)
    else:
        assert verdict.reason == "unparseable_body"
