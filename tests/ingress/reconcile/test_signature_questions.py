"""Signature questions answered from GitHub's delivery logs (ingress/reconcile/
signature_questions.py), against the local fake GitHub API with `requests` and the real
ingress: bodies GitHub's own examples send twice when the same thing happens twice."""

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError
from django.utils import timezone

from ingress.handlers import unregister, webhook_handler
from ingress.inbox import inbox_run_once
from ingress.models import RawEvent, SignatureQuestion
from ingress.reconcile.signature_questions import (
    DELIVERED_BEFORE_RECEIVED,
    NO_HOOKS,
    signature_questions_ask,
)
from ingress.reconcile.tasks import signature_questions_github
from tests.ingress.reconcile.conftest import REPO_HOOK, run
from tests.support.signing import github_headers

pytestmark = pytest.mark.django_db

EXAMPLES = json.loads((Path(__file__).parents[1] / "github_examples.json").read_text())
ORG_HOOK = "/orgs/acme/hooks/9"
LATER = timedelta(minutes=15)  # past SIGNATURE_QUESTION_LISTING_LAG_SECONDS (10 min)


@pytest.fixture
def blocked(settings, github_api):
    """Handlers for the examples' events; the API knows the repository and organization hook."""
    settings.RECONCILE_GITHUB_HOOKS = ["acme/app:7", "acme:9"]
    calls: list[int] = []

    def on_org_block(event, payload):
        calls.append(event.id)

    webhook_handler(provider="github", event_types=["org_block", "member"])(on_org_block)
    yield calls
    unregister(f"{on_org_block.__module__}.{on_org_block.__qualname__}")


def body_of(example: str) -> bytes:
    return json.dumps(EXAMPLES[example], indent=2).encode()


def receive(client, example: str, guid: str) -> RawEvent:
    body = body_of(example)
    event = example.split(".")[0]
    headers = github_headers(body, event=event, delivery=guid)
    response = client.post("/webhooks/github/", body, content_type="application/json", **headers)
    assert response.status_code == 202
    return RawEvent.objects.get(pk=response.json()["id"])


def sent(github_api, hook: str, example: str, guid: str, client) -> RawEvent:
    """GitHub lists the delivery, and it reaches us."""
    github_api.add_delivery(hook, guid=guid, delivered_at=timezone.now(), event="org_block")
    return receive(client, example, guid)


def state(event: RawEvent) -> tuple[str, str, str]:
    event.refresh_from_db()
    return event.signature_status, event.rejection_reason, event.dispatch_status


def test_a_user_blocked_three_times_is_handled_three_times_and_a_replay_never(
    client, github_api, blocked
):
    first = sent(github_api, REPO_HOOK, "org_block.blocked", "g-block-1", client)
    second = sent(github_api, REPO_HOOK, "org_block.blocked", "g-block-2", client)
    third = sent(github_api, ORG_HOOK, "org_block.blocked", "g-block-3", client)  # other hook
    forged = receive(client, "org_block.blocked", "g-invented-by-an-attacker")
    inbox_run_once()
    assert blocked == [first.id]
    assert {state(e)[0] for e in (second, third, forged)} == {"questioned"}

    # Asked at once: the listed ones are genuine, the invented one is too young to judge.
    outcome = signature_questions_ask()
    assert (outcome.asked, outcome.genuine, outcome.replayed, outcome.waiting) == (3, 2, 0, 1)
    assert state(second) == state(third) == ("pending", "", "waiting")  # to the inbox
    inbox_run_once()
    assert state(second) == state(third) == ("verified", "", "dispatched")
    assert state(forged) == ("questioned", "", "waiting")
    question = SignatureQuestion.objects.get(raw_event_id=forged.id)
    assert "younger than SIGNATURE_QUESTION_LISTING_LAG_SECONDS" in question.evidence
    listed = SignatureQuestion.objects.get(raw_event_id=third.id)
    assert (listed.answer, listed.answered_by) == ("genuine", "github")
    assert "org acme hook 9" in listed.evidence

    # Past the listing lag, GitHub still lists no such GUID: a replay.
    outcome = signature_questions_ask(now=timezone.now() + LATER)
    assert (outcome.asked, outcome.replayed) == (1, 1)
    assert state(forged) == ("rejected", "replayed_signature", "not_dispatched")
    assert "GitHub does not list it" in SignatureQuestion.objects.get(pk=forged.id).evidence
    inbox_run_once()
    assert sorted(blocked) == sorted([first.id, second.id, third.id])
    # Nothing left to ask: no call to GitHub at all.
    calls = len(github_api.requests)
    assert signature_questions_ask().asked == 0 and len(github_api.requests) == calls


def test_a_listing_that_stops_early_rejects_nothing(client, github_api, blocked):
    sent(github_api, REPO_HOOK, "member.added", "g-added-1", client)
    repeat = receive(client, "member.added", "g-unknown")
    inbox_run_once()
    github_api.rate_limited = "secondary"
    outcome = signature_questions_ask(now=timezone.now() + LATER)
    assert (outcome.replayed, outcome.waiting) == (0, 1)
    assert state(repeat)[0] == "questioned"
    assert "rate limit" in SignatureQuestion.objects.get(pk=repeat.id).evidence
    github_api.rate_limited = None
    assert signature_questions_ask(now=timezone.now() + LATER).replayed == 1


def test_a_listing_that_does_not_reach_back_far_enough_rejects_nothing(
    client, github_api, blocked, settings
):
    sent(github_api, REPO_HOOK, "member.added", "g-added-1", client)
    repeat = receive(client, "member.added", "g-unknown")
    inbox_run_once()
    settings.RECONCILE_MAX_PAGES = 1
    # Newer deliveries than the question fill the first page (3 a page).
    for n in range(4):
        github_api.add_delivery(REPO_HOOK, guid=f"g-later-{n}", delivered_at=timezone.now())
    outcome = signature_questions_ask(now=timezone.now() + LATER)
    assert (outcome.replayed, outcome.waiting) == (0, 1)
    assert "page limit" in SignatureQuestion.objects.get(pk=repeat.id).evidence


def test_older_than_github_keeps_deliveries_waits_for_an_operator(client, github_api, blocked):
    sent(github_api, REPO_HOOK, "member.added", "g-added-1", client)
    repeat = receive(client, "member.added", "g-unknown")
    inbox_run_once()
    outcome = signature_questions_ask(now=timezone.now() + timedelta(days=3))
    assert (outcome.replayed, outcome.waiting) == (0, 1)
    assert "an operator decides" in SignatureQuestion.objects.get(pk=repeat.id).evidence
    assert state(repeat)[0] == "questioned"


def test_without_api_access_the_questions_wait_for_an_operator(client, github_api, settings):
    settings.RECONCILE_GITHUB_HOOKS = []
    receive(client, "membership.added", "g-1")
    repeat = receive(client, "membership.added", "g-2")
    inbox_run_once()
    outcome = signature_questions_ask()
    assert (outcome.error, outcome.waiting) == (NO_HOOKS, 1)
    assert NO_HOOKS in SignatureQuestion.objects.get(pk=repeat.id).evidence
    assert "1 waiting" in signature_questions_github()
    with pytest.raises(CommandError, match="RECONCILE_GITHUB_HOOKS is empty"):
        run("answer_signature_questions")
    settings.RECONCILE_GITHUB_HOOKS = ["acme/app:7"]
    settings.GITHUB_API_TOKEN = ""
    assert "GITHUB_API_TOKEN is not set" in signature_questions_ask().error
    assert state(repeat)[0] == "questioned"
    assert github_api.requests == []


def test_the_command_prints_each_answer(client, github_api, blocked):
    sent(github_api, REPO_HOOK, "github_app_authorization.revoked", "g-revoked-1", client)
    repeat = sent(github_api, REPO_HOOK, "github_app_authorization.revoked", "g-revoked-2", client)
    inbox_run_once()
    output = run("answer_signature_questions")
    assert f"#{repeat.id} g-revoked-2: genuine (pending); GitHub lists it" in output
    assert "1 asked, 1 genuine, 0 replayed, 0 waiting" in output


def test_the_walk_stops_once_it_reaches_back_past_the_oldest_question(client, github_api, blocked):
    long_ago = timezone.now() - timedelta(hours=5)
    for n in range(9):  # three pages of deliveries older than any question
        github_api.add_delivery(REPO_HOOK, guid=f"g-old-{n}", delivered_at=long_ago)
    sent(github_api, REPO_HOOK, "sponsorship.created", "g-sponsor-1", client)
    receive(client, "sponsorship.created", "g-sponsor-forged")
    inbox_run_once()
    signature_questions_ask(now=timezone.now() + LATER)
    repo_pages = [r for r in github_api.list_requests() if r["path"].startswith("/repos/")]
    # Of four pages, the newest reaches past the question (less the clocks' margin): one.
    assert timedelta(hours=5) > DELIVERED_BEFORE_RECEIVED
    assert len(repo_pages) == 1
