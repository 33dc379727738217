"""Rules every verifier shares: secret rotation and the timestamp window around received_at."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from ingress.providers import PROVIDERS as PROVIDERS_TABLE
from tests.ingress.verifiers.signing import (
    EXPECTED,
    PROVIDERS,
    RECEIVED_AT,
    SECRETS,
    SIGNED_AT,
    TIMESTAMPED,
    TOLERANCE,
    make_source,
    sign,
)


def verify(provider, source, request):
    return PROVIDERS_TABLE[provider].verify(source, request)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_signed_example_is_verified_with_routing_fields(provider):
    old, _ = SECRETS[provider]
    verdict = verify(provider, make_source(provider, old), sign(provider, old))
    assert verdict.ok, verdict.reason
    assert (verdict.event_type, verdict.provider_event_id) == EXPECTED[provider]
    assert verdict.secret_index == 0


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("signed_with", [0, 1])
def test_both_secrets_accepted_during_rotation_and_the_match_is_recorded(provider, signed_with):
    source = make_source(provider, *SECRETS[provider])
    verdict = verify(provider, source, sign(provider, SECRETS[provider][signed_with]))
    assert verdict.ok, verdict.reason
    assert verdict.secret_index == signed_with


@pytest.mark.parametrize("provider", PROVIDERS)
def test_after_rotation_an_event_signed_with_the_removed_secret_is_bad(provider):
    old, new = SECRETS[provider]
    verdict = verify(provider, make_source(provider, new), sign(provider, old))
    assert verdict.reason == "bad_signature"
    assert verdict.secret_index is None


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_secret_not_in_the_source_is_bad_signature(provider):
    verdict = verify(
        provider, make_source(provider, SECRETS[provider][1]), sign(provider, "forger")
    )
    assert verdict.reason == "bad_signature"


@pytest.mark.parametrize("provider", TIMESTAMPED)
@pytest.mark.parametrize(
    ("age_seconds", "reason"),
    [
        (0, ""),
        (TOLERANCE - 1, ""),
        (TOLERANCE, ""),  # exactly at the tolerance: still inside
        (TOLERANCE + 1, "stale_timestamp"),
        (-(TOLERANCE - 1), ""),
        (-TOLERANCE, ""),
        (-(TOLERANCE + 1), "future_timestamp"),
        (86_400, "stale_timestamp"),
        (-86_400, "future_timestamp"),
    ],
)
def test_timestamp_window_is_measured_against_received_at(provider, age_seconds, reason):
    secret = SECRETS[provider][0]
    received_at = datetime.fromtimestamp(SIGNED_AT + age_seconds, tz=UTC)
    request = replace(sign(provider, secret), received_at=received_at)
    assert verify(provider, make_source(provider, secret), request).reason == reason


@pytest.mark.parametrize("provider", TIMESTAMPED)
def test_event_received_in_time_is_still_verified_twenty_minutes_later(provider):
    # Signed and received 20 minutes ago, verified now (a backlog or a re-verification).
    secret = SECRETS[provider][0]
    received_at = datetime.now(tz=UTC) - timedelta(minutes=20)
    signed_at = int(received_at.timestamp()) - 1
    request = replace(sign(provider, secret, signed_at), received_at=received_at)
    assert verify(provider, make_source(provider, secret), request).ok


@pytest.mark.parametrize("provider", TIMESTAMPED)
def test_the_source_tolerance_is_used(provider):
    secret = SECRETS[provider][0]
    request = replace(sign(provider, secret), received_at=RECEIVED_AT + timedelta(seconds=60))
    assert verify(provider, make_source(provider, secret, tolerance_seconds=90), request).ok
    narrow = make_source(provider, secret, tolerance_seconds=30)
    assert verify(provider, narrow, request).reason == "stale_timestamp"


@pytest.mark.parametrize("provider", TIMESTAMPED)
def test_a_forged_and_stale_event_says_bad_signature(provider):
    # The signature is checked before the clock, so stale_timestamp always means "authentic
    # but late" and a forgery is never mistaken for a backlog.
    request = replace(sign(provider, "forger"), received_at=RECEIVED_AT + timedelta(days=1))
    source = make_source(provider, SECRETS[provider][0])
    assert verify(provider, source, request).reason == "bad_signature"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_forged_body_says_bad_signature_even_when_it_is_not_json(provider):
    secret = SECRETS[provider][0]
    request = replace(sign(provider, secret), body=b"not json at all")
    assert verify(provider, make_source(provider, secret), request).reason == "bad_signature"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unusable_secrets_only_is_no_secret_configured(provider):
    source = make_source(provider, "   ", "\udcff")  # blank; undecodable environment bytes
    verdict = verify(provider, source, sign(provider, SECRETS[provider][0]))
    assert verdict.reason == "no_secret_configured"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_unusable_secret_is_skipped_and_indexes_stay_those_of_the_source(provider):
    secret = SECRETS[provider][0]
    verdict = verify(provider, make_source(provider, "   ", secret), sign(provider, secret))
    assert verdict.ok, verdict.reason
    assert verdict.secret_index == 1
