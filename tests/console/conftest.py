"""Fixtures for the console: operators with and without payload rights, signed events."""

import hashlib
import hmac
import json
import os

import pytest
from django.contrib.auth.models import Permission

from ingress.handlers import unregister, webhook_handler
from ingress.models import RawEvent
from tests.recaps.fixtures import fake_stripe  # noqa: F401 (the buyer API's rows)

# What an on-call engineer who may act but not read payloads is given.
OPERATOR_PERMISSIONS = (
    "ingress.view_rawevent",
    "ingress.view_delivery",
    "console.view_operatoraction",
    "console.operate",
)


def grant(user, *perms: str):
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    # has_perm() caches per user instance.
    return type(user).objects.get(pk=user.pk)


@pytest.fixture
def operator(django_user_model):
    user = django_user_model.objects.create_user("operator", password="pw-operator", is_staff=True)
    return grant(user, *OPERATOR_PERMISSIONS)


@pytest.fixture
def payload_operator(django_user_model):
    user = django_user_model.objects.create_user("reader", password="pw-reader", is_staff=True)
    return grant(user, *OPERATOR_PERMISSIONS, "ingress.view_raw_payload")


@pytest.fixture
def outsider(django_user_model):
    """Signed in, has every permission we hand out, but is not staff."""
    user = django_user_model.objects.create_user("outsider", password="pw-outsider")
    return grant(user, *OPERATOR_PERMISSIONS, "ingress.view_raw_payload")


class Recorder:
    def __init__(self):
        self.calls: list[int] = []
        self.fail_with: Exception | None = None

    def __call__(self, event, payload):
        self.calls.append(event.id)
        if self.fail_with is not None:
            raise self.fail_with


@pytest.fixture
def push_handler():
    """A handler for GitHub push events, registered only for the test."""
    recorder = Recorder()

    def console_test_on_push(event, payload):
        recorder(event, payload)

    webhook_handler(provider="github", event_types=["push"])(console_test_on_push)
    yield recorder
    unregister(f"{console_test_on_push.__module__}.{console_test_on_push.__qualname__}")


def github_signature(body: bytes, secret: str | None = None) -> str:
    secret = secret if secret is not None else os.environ["GITHUB_WEBHOOK_SECRET"]
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def receive_github(
    client,
    payload: dict | None = None,
    *,
    body: bytes | None = None,
    delivery: str = "d-1",
    event: str = "push",
    secret: str | None = None,
) -> RawEvent:
    """POST a signed GitHub webhook through the real receive path; returns the stored row."""
    if body is None:
        # Distinct events, distinct bodies: the same signature under another delivery id is
        # a replay (ingress/signature_replays.py).
        body = json.dumps(payload or {"ref": "refs/heads/main", "delivery": delivery}).encode()
    response = client.generic(
        "POST",
        "/webhooks/github/",
        body,
        content_type="application/json",
        HTTP_X_HUB_SIGNATURE_256=github_signature(body, secret),
        HTTP_X_GITHUB_EVENT=event,
        HTTP_X_GITHUB_DELIVERY=delivery,
    )
    assert response.status_code == 202, response.content
    return RawEvent.objects.get(pk=response.json()["id"])


@pytest.fixture
def fake_renderer(settings):
    """The project's fake render service on an ephemeral port, with short client limits."""
    from fakes.renderer import FakeRenderer

    fake = FakeRenderer(secret=os.environ["RENDERER_WEBHOOK_SECRET"], callbacks=False)
    settings.RENDER_SERVICE_URL = fake.url
    settings.RENDER_CALLBACK_URL = "http://127.0.0.1:9/webhooks/renderer/"
    settings.RENDER_HEALTH_CONNECT_TIMEOUT_SECONDS = 0.5
    settings.RENDER_HEALTH_READ_TIMEOUT_SECONDS = 0.5
    settings.RENDER_HEALTH_TIMEOUT_SECONDS = 1.0
    settings.RENDER_CONNECT_TIMEOUT_SECONDS = 0.5
    settings.RENDER_READ_TIMEOUT_SECONDS = 0.4
    settings.RENDER_TIMEOUT_SECONDS = 1.0
    with fake:
        yield fake


@pytest.fixture
def dead_side_effect(fake_renderer, admin_user, client):
    """A render row that died on a verdict about it (the render service's 422 for this
    request: the finality rule's evidence; a 5xx charges no row), and its failed recap."""
    from datetime import timedelta

    from django.utils import timezone

    from outbox.dispatcher import dispatch_run
    from outbox.models import CircuitBreaker, RecapSideEffect
    from tests.console.samples import paid_recap

    recap = paid_recap(client, admin_user)
    fake_renderer.configure(mode="error_4xx")
    start = timezone.now()
    for day in range(8):
        dispatch_run(now=start + timedelta(days=day))
        if RecapSideEffect.objects.get(recap=recap).status == "dead":
            break
    row = RecapSideEffect.objects.get(recap=recap)
    assert row.status == "dead", row.status
    # The service is fine again, and any breaker state forgotten, so a re-armed row is
    # dispatched on the next run.
    fake_renderer.configure(mode="ok")
    CircuitBreaker.objects.all().delete()
    return row
