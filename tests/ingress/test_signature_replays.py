"""Body-only signatures seen again under a new delivery id (ingress/signature_replays.py).

GitHub signs the body only, and X-GitHub-Delivery is not signed: a captured delivery sent
again with a made-up delivery id verifies (issue 30). But a genuine event whose body carries
no id or time of its own sends the same bytes when the same thing happens twice (issue 40):
such a request is questioned, neither handled nor rejected, until an answer about that one
delivery settles it. Every request here goes through the real receive view and the real
inbox; the answers through ingress.services.signature_question_answer.
"""

import hashlib
import hmac
import json
from collections.abc import Iterator

import pytest

from ingress.handlers import unregister, webhook_handler
from ingress.inbox import inbox_run_once
from ingress.models import DedupKey, Delivery, RawEvent, SignatureQuestion
from ingress.services import (
    AnswerRefused,
    raw_event_reverify,
    signature_question_answer,
)
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


def answer(event: RawEvent, *, genuine: bool) -> RawEvent:
    return signature_question_answer(
        raw_event_id=event.id, genuine=genuine, answered_by="test", evidence="said so"
    )


def test_a_repeated_body_under_a_new_delivery_id_waits_questioned_and_a_replay_ends_rejected(
    client, handled
):
    original = post_github(client, delivery="guid-original")
    inbox_run_once()
    assert settled(original) == ("verified", "", "dispatched")
    assert len(handled) == 1

    replay = post_github(client, delivery="guid-made-up-by-the-attacker")
    inbox_run_once()
    assert settled(replay) == ("questioned", "", "waiting")
    question = SignatureQuestion.objects.get(raw_event_id=replay.id)
    assert (question.repeats_id, question.delivery_id, question.answer) == (
        original.id,
        "guid-made-up-by-the-attacker",
        "",
    )
    assert bytes(replay.body) == BODY  # stored as received
    assert not Delivery.objects.filter(raw_event=replay).exists()
    inbox_run_once()  # not claimed again: it waits for its answer, not for the inbox
    assert settled(replay) == ("questioned", "", "waiting") and len(handled) == 1

    answer(replay, genuine=False)
    assert settled(replay) == ("rejected", "replayed_signature", "not_dispatched")
    assert len(handled) == 1
    # Re-verifying it (after a secret fix, say) finds the same answer.
    raw_event_reverify(raw_event=replay)
    assert settled(replay) == ("rejected", "replayed_signature", "not_dispatched")
    assert len(handled) == 1
    with pytest.raises(AnswerRefused):
        answer(replay, genuine=True)


def test_identical_bodies_answered_genuine_are_each_handled_once(client, handled):
    """A member added, removed and added again: the same bytes under new delivery ids."""
    first = post_github(client, delivery="guid-1st")
    again = [post_github(client, delivery=f"guid-again-{n}") for n in range(2)]
    inbox_run_once()
    assert [settled(event)[0] for event in again] == ["questioned", "questioned"]
    for event in again:
        answer(event, genuine=True)
        assert settled(event) == ("pending", "", "waiting")  # handed back to the inbox
        # Answered twice (a scheduled run after an operator): settled once.
        with pytest.raises(AnswerRefused):
            answer(event, genuine=True)
    inbox_run_once()
    assert [settled(event) for event in again] == [("verified", "", "dispatched")] * 2
    assert sorted(handled) == sorted([first.id, *(event.id for event in again)])
    # A redelivery of an answered one is a duplicate of it, as any redelivery.
    redelivery = post_github(client, delivery="guid-again-0")
    inbox_run_once()
    assert settled(redelivery) == ("verified", "", "duplicate")
    assert redelivery.duplicate_of_id == again[0].id
    assert len(handled) == 3


def test_a_rejection_of_the_old_rule_is_questioned_when_re_verified(client, handled):
    """Rows the earlier rule rejected at once (`replayed_signature` without a question) go
    back to being a question when an operator re-verifies them."""
    post_github(client, delivery="guid-before")
    inbox_run_once()
    wrongly = post_github(client, delivery="guid-rejected-by-the-old-rule")
    RawEvent.objects.filter(pk=wrongly.pk).update(
        signature_status="rejected",
        rejection_reason="replayed_signature",
        dispatch_status="not_dispatched",
    )
    raw_event_reverify(raw_event=wrongly)
    assert settled(wrongly) == ("questioned", "", "waiting")


def test_a_redelivery_with_the_same_delivery_id_stays_a_duplicate(client, handled):
    original = post_github(client, delivery="guid-1")
    inbox_run_once()
    redelivery = post_github(client, delivery="guid-1")
    inbox_run_once()
    assert settled(redelivery) == ("verified", "", "duplicate")
    assert redelivery.duplicate_of_id == original.id
    assert len(handled) == 1


def test_a_repeat_in_the_same_batch_as_its_original_is_questioned(client, handled):
    original = post_github(client, delivery="guid-first")
    repeats = [post_github(client, delivery=f"guid-repeat-{n}") for n in range(3)]
    inbox_run_once()
    assert settled(original) == ("verified", "", "dispatched")
    for repeat in repeats:
        assert settled(repeat) == ("questioned", "", "waiting")
        assert SignatureQuestion.objects.get(raw_event_id=repeat.id).repeats_id == original.id
    assert handled == [original.id]


def test_upper_case_hex_is_the_same_signature(client, handled):
    post_github(client, delivery="guid-lower")
    inbox_run_once()
    digest = hmac.new(b"It's a Secret to Everybody", BODY, hashlib.sha256).hexdigest()
    replay = post_github(
        client, delivery="guid-upper", HTTP_X_HUB_SIGNATURE_256=f"sha256={digest.upper()}"
    )
    inbox_run_once()
    assert settled(replay) == ("questioned", "", "waiting")


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


def test_a_generic_hmac_delivery_repeated_under_a_new_id_is_questioned(client, acme):
    original = post_acme(client, delivery="acme-1")
    inbox_run_once()
    assert settled(original)[0] == "verified"
    repeat = post_acme(client, delivery="acme-2")
    redelivery = post_acme(client, delivery="acme-1")
    inbox_run_once()
    assert settled(repeat) == ("questioned", "", "waiting")
    assert settled(redelivery) == ("verified", "", "duplicate")
