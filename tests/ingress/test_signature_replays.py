"""Body-only signatures replayed under a new delivery id (issue 30, ingress/signature_replays.py).

GitHub signs the body only, and X-GitHub-Delivery is not signed: a captured delivery sent
again with a made-up delivery id verified, and dedup (on that id) dispatched it again.
Every request here goes through the real receive view and the real inbox.
"""

import hashlib
import hmac
import json
from collections.abc import Iterator

import pytest

from ingress.handlers import unregister, webhook_handler
from ingress.inbox import inbox_run_once
from ingress.models import DedupKey, Delivery, RawEvent
from ingress.services import raw_event_reverify
from tests.support.signing import github_headers

pytestmark = pytest.mark.django_db

BODY = json.dumps({"ref": "refs/heads/main", "after": "5f1c0de"}).encode()


@pytest.fixture
def handled() -> Iterator[list[int]]:
    """The ids of the GitHub push events a handler was run for."""
    calls: list[int] = []

    def replays_test_on_push(event, payload):
        calls.append(event.id)

    webhook_handler(provider="github", event_types=["push"])(replays_test_on_push)
    yield calls
    unregister(f"{replays_test_on_push.__module__}.{replays_test_on_push.__qualname__}")


def post_github(client, *, delivery: str, body: bytes = BODY, **overrides) -> RawEvent:
    headers = {**github_headers(body, delivery=delivery), **overrides}
    response = client.post("/webhooks/github/", body, content_type="application/json", **headers)
    assert response.status_code == 202, response.content
    return RawEvent.objects.get(pk=response.json()["id"])


def settled(event: RawEvent) -> tuple[str, str, str]:
    event.refresh_from_db()
    return event.signature_status, event.rejection_reason, event.dispatch_status


def test_a_github_delivery_replayed_with_a_new_delivery_id_is_stored_and_never_handled(
    client, handled
):
    original = post_github(client, delivery="guid-original")
    inbox_run_once()
    assert settled(original) == ("verified", "", "dispatched")
    assert len(handled) == 1

    replay = post_github(client, delivery="guid-made-up-by-the-attacker")
    inbox_run_once()
    assert settled(replay) == ("rejected", "replayed_signature", "not_dispatched")
    assert bytes(replay.body) == BODY  # stored as received, for forensics
    assert not Delivery.objects.filter(raw_event=replay).exists()
    assert len(handled) == 1
    # Re-verifying it (after a secret fix, say) finds the same replay.
    raw_event_reverify(raw_event=replay)
    assert settled(replay) == ("rejected", "replayed_signature", "not_dispatched")
    assert len(handled) == 1


def test_a_redelivery_with_the_same_delivery_id_stays_a_duplicate(client, handled):
    original = post_github(client, delivery="guid-1")
    inbox_run_once()
    redelivery = post_github(client, delivery="guid-1")
    inbox_run_once()
    assert settled(redelivery) == ("verified", "", "duplicate")
    assert redelivery.duplicate_of_id == original.id
    assert len(handled) == 1


def test_a_replay_in_the_same_batch_as_its_original_loses_to_it(client, handled):
    original = post_github(client, delivery="guid-first")
    replays = [post_github(client, delivery=f"guid-replay-{n}") for n in range(3)]
    inbox_run_once()
    assert settled(original) == ("verified", "", "dispatched")
    for replay in replays:
        assert settled(replay) == ("rejected", "replayed_signature", "not_dispatched")
    assert handled == [original.id]


def test_upper_case_hex_is_the_same_signature(client, handled):
    post_github(client, delivery="guid-lower")
    inbox_run_once()
    digest = hmac.new(b"It's a Secret to Everybody", BODY, hashlib.sha256).hexdigest()
    replay = post_github(
        client, delivery="guid-upper", HTTP_X_HUB_SIGNATURE_256=f"sha256={digest.upper()}"
    )
    inbox_run_once()
    assert settled(replay) == ("rejected", "replayed_signature", "not_dispatched")


def test_different_bodies_are_different_events(client, handled):
    first = post_github(client, delivery="guid-a")
    second = post_github(client, delivery="guid-b", body=BODY.replace(b"5f1c0de", b"77aa001"))
    inbox_run_once()
    assert settled(first)[0] == settled(second)[0] == "verified"
    assert len(handled) == 2


def test_the_original_keeps_its_claim_when_re_verified(client, handled):
    """The claim is the event's: settling the holder again (a re-verify after it was set
    aside) finds itself holding it, not a replay."""
    original = post_github(client, delivery="guid-held")
    inbox_run_once()
    [claim] = DedupKey.objects.filter(key__startswith="sig:")
    assert claim.raw_event_id == original.id and claim.source == "github"
    # As if settling it had been rejected `processing_failed`, then re-verified.
    RawEvent.objects.filter(pk=original.pk).update(
        signature_status="rejected", rejection_reason="processing_failed"
    )
    Delivery.objects.filter(raw_event=original).delete()
    DedupKey.objects.filter(key__startswith="id:").delete()
    raw_event_reverify(raw_event=original)
    assert settled(original) == ("verified", "", "dispatched")


@pytest.fixture
def acme(settings, monkeypatch):
    """A generic HMAC sender: body-only signature, its own delivery id header."""
    monkeypatch.setenv("ACME_WEBHOOK_SECRET", "acme-secret")
    settings.WEBHOOK_EXTRA_SOURCES = json.dumps(
        {
            "acme": {
                "provider": "hmac",
                "secrets_env": "ACME_WEBHOOK_SECRET",
                "signature_header": "X-Acme-Signature",
                "signature_prefix": "sha256=",
                "delivery_id_header": "X-Acme-Delivery",
            }
        }
    )


def post_acme(client, *, delivery: str) -> RawEvent:
    body = json.dumps({"type": "thing.happened", "id": "thing-1"}).encode()
    digest = hmac.new(b"acme-secret", body, hashlib.sha256).hexdigest()
    response = client.post(
        "/webhooks/acme/",
        body,
        content_type="application/json",
        HTTP_X_ACME_SIGNATURE=f"sha256={digest}",
        HTTP_X_ACME_DELIVERY=delivery,
    )
    assert response.status_code == 202, response.content
    return RawEvent.objects.get(pk=response.json()["id"])


def test_a_generic_hmac_delivery_replayed_under_a_new_id_is_refused(client, acme):
    original = post_acme(client, delivery="acme-1")
    inbox_run_once()
    assert settled(original)[0] == "verified"
    replay = post_acme(client, delivery="acme-2")
    redelivery = post_acme(client, delivery="acme-1")
    inbox_run_once()
    assert settled(replay) == ("rejected", "replayed_signature", "not_dispatched")
    assert settled(redelivery) == ("verified", "", "duplicate")
