"""Fixtures shared by tests/recaps and tests/outbox (imported by both conftest modules)."""

import os
from datetime import UTC, datetime

import pytest

from fakes.renderer import FakeRenderer
from outbox.models import RecapSideEffect
from recaps.services import recap_mark_paid
from tests.recaps.factories import EventFactory, RecapFactory

# A fixed, simulated "now" for tests that move time by hand.
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def fake_renderer(settings):
    """The fake render service on an ephemeral port, with short client limits.

    Callbacks are off here (nothing listens for them); the end-to-end test turns them on
    and points them at a live server.
    """
    fake = FakeRenderer(secret=os.environ["RENDERER_WEBHOOK_SECRET"], callbacks=False)
    settings.RENDER_SERVICE_URL = fake.url
    settings.RENDER_CALLBACK_URL = "http://127.0.0.1:9/webhooks/renderer/"
    # Short enough for timeout tests to be quick, long enough for a loaded CI machine.
    # Worst case of one dispatch: health 2.0 s + 1 x render 2.0 s = 4.0 s.
    settings.RENDER_HEALTH_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.RENDER_HEALTH_READ_TIMEOUT_SECONDS = 1.0
    settings.RENDER_HEALTH_TIMEOUT_SECONDS = 2.0
    settings.RENDER_CONNECT_TIMEOUT_SECONDS = 1.0
    settings.RENDER_READ_TIMEOUT_SECONDS = 1.0
    settings.RENDER_TIMEOUT_SECONDS = 2.0
    with fake:
        yield fake


def pay(recap, *, now=None, reference=None):
    recap_mark_paid(
        recap_id=recap.id, payment_reference=reference or f"pi_{recap.id.hex[:12]}", now=now
    )
    return RecapSideEffect.objects.get(recap=recap)


@pytest.fixture
def paid_recap():
    def make(*, now=T0, photos=None, **kwargs):
        event = EventFactory.create(photos=photos) if photos is not None else EventFactory.create()
        recap = RecapFactory.create(event=event, **kwargs)
        side_effect = pay(recap, now=now)
        return recap, side_effect

    return make


@pytest.fixture
def fake_stripe(settings):
    from fakes.stripe import FakeStripe

    with FakeStripe(webhook_secret=os.environ["STRIPE_WEBHOOK_SECRET"]) as fake:
        settings.STRIPE_API_BASE = fake.url
        settings.STRIPE_CONNECT_TIMEOUT_SECONDS = 0.5
        settings.STRIPE_READ_TIMEOUT_SECONDS = 0.3
        settings.STRIPE_MAX_NETWORK_RETRIES = 0
        yield fake
