"""Fixtures for reconciliation: local fake Stripe and GitHub APIs, handlers, receive helpers.

Both fakes are real HTTP servers on ephemeral 127.0.0.1 ports; the real `stripe` SDK and
`requests` talk to them, so timeouts, retries, pagination and error mapping are the code's
own. Loopback is the one place a plain-HTTP API base is accepted.
"""

import json
import threading
from io import StringIO

import pytest
from django.core.management import call_command

from fakes.github import FakeGitHub
from ingress.handlers import unregister, webhook_handler
from ingress.models import RawEvent
from tests.ingress.reconcile.fake_stripe_events import FakeStripeEvents
from tests.support.signing import github_headers, stripe_headers

STRIPE_TYPE = "test.reconcile"
GITHUB_TOKEN = "ghp_test_reconcile_token"
REPO_HOOK = "/repos/acme/app/hooks/7"


class Recorder:
    """A registered handler that records the provider id of every event it is given."""

    def __init__(self):
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, event, payload):
        with self.lock:
            self.calls.append(payload.get("id") or event.delivery_id)


@pytest.fixture
def stripe_api(settings):
    with FakeStripeEvents(api_key=settings.STRIPE_API_KEY) as fake:
        settings.STRIPE_API_BASE = fake.url
        settings.STRIPE_CONNECT_TIMEOUT_SECONDS = 1.0
        settings.STRIPE_READ_TIMEOUT_SECONDS = 2.0
        settings.STRIPE_MAX_NETWORK_RETRIES = 0
        settings.RECONCILE_STRIPE_EVENT_TYPES = [STRIPE_TYPE]
        yield fake


@pytest.fixture
def github_api(settings):
    with FakeGitHub(token=GITHUB_TOKEN, page_size=3) as fake:
        settings.GITHUB_API_BASE = fake.url
        settings.GITHUB_API_TOKEN = GITHUB_TOKEN
        settings.GITHUB_CONNECT_TIMEOUT_SECONDS = 1.0
        settings.GITHUB_READ_TIMEOUT_SECONDS = 2.0
        settings.GITHUB_MAX_RETRIES = 0
        yield fake


@pytest.fixture
def stripe_handler():
    recorder = Recorder()

    def on_reconciled_event(event, payload):
        recorder(event, payload)

    webhook_handler(provider="stripe", event_types=[STRIPE_TYPE])(on_reconciled_event)
    yield recorder
    unregister(f"{on_reconciled_event.__module__}.{on_reconciled_event.__qualname__}")


@pytest.fixture
def push_handler():
    recorder = Recorder()

    def on_redelivered_push(event, payload):
        recorder(event, payload)

    webhook_handler(provider="github", event_types=["push"])(on_redelivered_push)
    yield recorder
    unregister(f"{on_redelivered_push.__module__}.{on_redelivered_push.__qualname__}")


def receive_stripe(client, event: dict) -> RawEvent:
    """The event as Stripe's webhook would bring it: signed, through the receive view."""
    body = json.dumps(event, indent=2).encode()
    response = client.post(
        "/webhooks/stripe/", body, content_type="application/json", **stripe_headers(body)
    )
    assert response.status_code == 202
    return RawEvent.objects.get(pk=response.json()["id"])


def receive_github(client, guid: str, *, event: str = "push") -> RawEvent:
    body = json.dumps({"ref": "refs/heads/main", "after": guid}).encode()
    response = client.post(
        "/webhooks/github/",
        body,
        content_type="application/json",
        **github_headers(body, event=event, delivery=guid),
    )
    assert response.status_code == 202
    return RawEvent.objects.get(pk=response.json()["id"])


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()
