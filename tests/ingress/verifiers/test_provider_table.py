"""The provider table (ingress/providers.py) is the one declaration of each provider: the
header the receive path demands is the one its verifier reads, the delivery id header is the
one the event is keyed by, and the inbox's entry points go through the table."""

from dataclasses import replace

import pytest

from ingress.models import RawEvent, RejectionReason
from ingress.providers import PROVIDERS, dedup_key_for, verify
from ingress.verifiers import Verdict
from tests.ingress.verifiers.signing import EXPECTED, SECRETS, make_request, make_source, sign


@pytest.mark.parametrize("provider", sorted(PROVIDERS))
def test_the_signature_header_the_receive_path_demands_is_the_one_the_verifier_reads(provider):
    source = make_source(provider, *SECRETS[provider])
    signed = sign(provider, SECRETS[provider][0])
    assert verify(source, signed).ok

    header = PROVIDERS[provider].signature_header
    headers = {name: value for name, value in signed.headers.items() if name != header}

    verdict = verify(source, make_request(headers, signed.body))
    assert verdict.reason == RejectionReason.MISSING_SIGNATURE


@pytest.mark.parametrize(
    "provider", sorted(name for name, spec in PROVIDERS.items() if spec.delivery_id_header)
)
def test_the_delivery_id_header_is_what_the_event_is_keyed_by(provider):
    source = make_source(provider, *SECRETS[provider])
    verdict = verify(source, sign(provider, SECRETS[provider][0]))

    delivery_id = sign(provider, SECRETS[provider][0]).headers[
        PROVIDERS[provider].delivery_id_header
    ]
    assert verdict.provider_event_id == delivery_id == EXPECTED[provider][1]
    event = RawEvent(source=source.name, provider=provider)
    assert dedup_key_for(event, verdict) == f"id:{delivery_id}"


def test_a_verifier_bug_is_a_verifier_error_not_an_exception(monkeypatch):
    def broken(source, request):
        raise KeyError("a bug")

    monkeypatch.setitem(PROVIDERS, "stripe", replace(PROVIDERS["stripe"], verify=broken))

    verdict = verify(make_source("stripe", "whsec_x"), sign("stripe", "whsec_x"))
    assert verdict.reason == RejectionReason.VERIFIER_ERROR


def test_the_dedup_key_follows_the_rule_of_the_events_provider(monkeypatch):
    monkeypatch.setitem(
        PROVIDERS, "hmac", replace(PROVIDERS["hmac"], dedup_key=lambda event, verdict: "custom")
    )

    assert dedup_key_for(RawEvent(source="acme", provider="hmac"), Verdict()) == "custom"
    keyed = dedup_key_for(RawEvent(source="s", provider="stripe"), Verdict(provider_event_id="e"))
    assert keyed == "id:e"
