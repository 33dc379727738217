"""Issue 40 on real processes: the Procfile's web server, the fake GitHub as its own server
process (`manage.py run_fake_github`: it signs and sends deliveries, and lists them on its
hook deliveries API), and `manage.py answer_signature_questions` as its own process. The
inbox's pass runs here, with a handler that records what it was given.

- GitHub sends the same bytes three times under three GUIDs (a user blocked, unblocked,
  blocked again: GitHub's own example payload, which has no id or time of its own): each
  is handled once. Before, every repeat was rejected `replayed_signature`.
- A captured delivery replayed under an invented GUID is never handled: it waits while it
  is younger than the listing lag, and ends rejected once GitHub's list could show it.
- GitHub's redelivery of a GUID already handled is a duplicate.
- With no API configured the repeats wait, /metrics says so (the alert's gauge), and an
  operator's answer through the API, audited, settles them.
"""

import json
from pathlib import Path

import pytest
import requests
from django.contrib.auth import get_user_model

from console.models import OperatorAction
from console.services import api_token_issue
from ingress.handlers import unregister, webhook_handler
from ingress.inbox import inbox_run_once
from ingress.models import RawEvent, SignatureQuestion
from tests.console.conftest import grant
from tests.support.processes import (
    app_env,
    free_port,
    manage,
    settings_database_url,
    start_manage,
    start_procfile,
)

EXAMPLES = json.loads((Path(__file__).parent / "github_examples.json").read_text())
TOKEN = "ghp_processes_token"
HOOK = "/repos/acme/app/hooks/7"
METRICS_TOKEN = "questioned-processes-metrics-token-0123456789"


def body_of(example: str) -> str:
    return json.dumps(EXAMPLES[example], indent=2)


@pytest.fixture
def handled():
    calls: list[str] = []

    def on_org_event(event, payload):
        calls.append(event.delivery_id)

    webhook_handler(provider="github", event_types=["org_block", "member"])(on_org_event)
    yield calls
    unregister(f"{on_org_event.__module__}.{on_org_event.__qualname__}")


@pytest.fixture
def servers(tmp_path):
    """The web server and the fake GitHub, each its own process; yields (web, github) URLs
    and the environment of the commands."""
    web_port, github_port = free_port(), free_port()
    env = app_env(
        settings_database_url(),
        WEB_CONCURRENCY="1",
        GITHUB_API_BASE=f"http://127.0.0.1:{github_port}",
        GITHUB_API_TOKEN=TOKEN,
        RECONCILE_GITHUB_HOOKS="acme/app:7",
        METRICS_BEARER_TOKEN=METRICS_TOKEN,
    )
    web = start_procfile("web", env, port=web_port, log=tmp_path / "web.log")
    github = start_manage(
        [
            "run_fake_github",
            "--port",
            str(github_port),
            "--page-size",
            "2",  # GitHub's cursor pagination, page after page
            "--webhook-url",
            f"http://127.0.0.1:{web_port}/webhooks/github/",
        ],
        env,
        log=tmp_path / "github.log",
    )
    try:
        web.wait_listening(web_port)
        github.wait_listening(github_port)
        yield f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{github_port}", env
    finally:
        github.stop()
        web.stop()


def github_sends(github: str, example: str) -> str:
    """GitHub delivers the example under a new GUID; the GUID."""
    event = example.split(".")[0]
    answer = requests.post(
        f"{github}/_fake/deliver",
        json={"hook": HOOK, "event": event, "body": body_of(example)},
        timeout=30,
    )
    answer.raise_for_status()
    assert answer.json()["status_code"] == 202, answer.json()
    return answer.json()["guid"]


def state(guid: str) -> list[tuple[str, str, str]]:
    return [
        (event.signature_status, event.rejection_reason, event.dispatch_status)
        for event in RawEvent.objects.filter(delivery_id=guid).order_by("id")
    ]


def listed_by(github: str) -> list[dict]:
    """Every delivery GitHub lists, page after page through its `Link` header."""
    deliveries: list[dict] = []
    url: str | None = f"{github}{HOOK}/deliveries?per_page=100"
    while url:
        page = requests.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        deliveries += page.json()
        url = page.links.get("next", {}).get("url")
    return deliveries


def answer_questions(env: dict, **extra: str) -> str:
    return manage("answer_signature_questions", env={**env, **extra}).stdout


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_repeats_github_lists_are_handled_once_each_and_an_invented_guid_never(servers, handled):
    web, github, env = servers
    guids = [github_sends(github, "org_block.blocked") for _ in range(3)]
    other = github_sends(github, "member.added")  # another delivery on GitHub's list
    # An attacker replays the captured first delivery, bytes and signature, under a new GUID.
    captured = RawEvent.objects.get(delivery_id=guids[0])
    headers = {**captured.headers, "x-github-delivery": "4f6c8a9e-invented-by-the-attacker"}
    forged = requests.post(
        f"{web}/webhooks/github/", data=bytes(captured.body), headers=headers, timeout=10
    )
    assert forged.status_code == 202

    inbox_run_once()
    assert sorted(handled) == sorted([guids[0], other])
    for guid in (*guids[1:], "4f6c8a9e-invented-by-the-attacker"):
        assert state(guid) == [("questioned", "", "waiting")]

    # Asked at once: GitHub lists the two repeats; the invented GUID is younger than the lag.
    output = answer_questions(env)
    assert "3 asked, 2 genuine, 0 replayed, 1 waiting" in output, output
    inbox_run_once()
    assert sorted(handled) == sorted([*guids, other])

    # Once GitHub's list would show it, its absence decides: a replay, never handled.
    output = answer_questions(env, SIGNATURE_QUESTION_LISTING_LAG_SECONDS="0")
    assert "1 asked, 0 genuine, 1 replayed, 0 waiting" in output, output
    assert state("4f6c8a9e-invented-by-the-attacker") == [
        ("rejected", "replayed_signature", "not_dispatched")
    ]

    # GitHub redelivers a repeat it had sent: the same GUID again is a duplicate.
    delivery_id = next(d["id"] for d in listed_by(github) if d["guid"] == guids[1])
    redelivered = requests.post(
        f"{github}{HOOK}/deliveries/{delivery_id}/attempts",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert redelivered.status_code == 202
    inbox_run_once()
    assert state(guids[1]) == [("verified", "", "dispatched"), ("verified", "", "duplicate")]
    assert sorted(handled) == sorted([*guids, other])  # each once; the forged one never
    assert "4f6c8a9e-invented-by-the-attacker" not in handled


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_without_api_access_the_repeats_wait_show_and_an_operator_settles_them(servers, handled):
    web, github, env = servers
    guids = [github_sends(github, "member.added") for _ in range(3)]
    inbox_run_once()
    assert handled == [guids[0]]

    no_api = {**env, "RECONCILE_GITHUB_HOOKS": ""}
    with pytest.raises(RuntimeError, match="RECONCILE_GITHUB_HOOKS is empty"):
        manage("answer_signature_questions", env=no_api)
    for guid in guids[1:]:
        assert state(guid) == [("questioned", "", "waiting")]
    question = SignatureQuestion.objects.get(delivery_id=guids[1])
    assert "GitHub not asked" in question.evidence

    scrape = requests.get(
        f"{web}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10
    ).text
    assert "eventdrop_raw_events_questioned 2.0" in scrape
    assert "eventdrop_raw_events_oldest_questioned_age_seconds" in scrape

    operator = get_user_model().objects.create_user("on-call", is_staff=True)
    operator = grant(operator, "ingress.view_rawevent", "console.operate")
    _, token = api_token_issue(user=operator, ttl_days=1)
    auth = {"Authorization": f"Token {token}"}
    ids = {guid: RawEvent.objects.get(delivery_id=guid).id for guid in guids[1:]}
    accepted = requests.post(
        f"{web}/api/raw-events/accept-repeat/",
        json={"ids": [ids[guids[1]]], "reason": "GitHub's Recent Deliveries lists it"},
        headers=auth,
        timeout=10,
    )
    assert accepted.status_code == 200, accepted.text
    assert state(guids[1]) == [("pending", "", "waiting")]  # handed to the inbox
    rejected = requests.post(
        f"{web}/api/raw-events/reject-repeat/",
        json={"ids": [ids[guids[2]]], "reason": "not in GitHub's Recent Deliveries"},
        headers=auth,
        timeout=10,
    )
    assert rejected.status_code == 200, rejected.text
    assert state(guids[2]) == [("rejected", "replayed_signature", "not_dispatched")]
    assert sorted(OperatorAction.objects.values_list("action", "actor_username", "succeeded")) == [
        ("raw_event_accept_repeat", "on-call", 1),
        ("raw_event_reject_repeat", "on-call", 1),
    ]
    inbox_run_once()
    assert state(guids[1]) == [("verified", "", "dispatched")]
    assert sorted(handled) == sorted(guids[:2])
    scrape = requests.get(
        f"{web}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10
    ).text
    assert "eventdrop_raw_events_questioned 0.0" in scrape
