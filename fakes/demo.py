"""`manage.py demo`: sample data and both recap paths, driven through the running app.

It writes through the same services as the API (recaps/services.py) and reaches every other
process the way production does: the Checkout Session through the stripe SDK (to the fake
Stripe of `make run`), the payment as a signed Stripe webhook POSTed by that fake to our own
ingress, the render through the outbox dispatcher and the render service's signed callback.
Nothing here marks a recap paid or ready itself: if a process is missing, the recap stops
where that process would have moved it, and `demo_hint` says which one.
"""

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db import transaction

from ingress.handlers import all_handlers
from ingress.models import Delivery
from ingress.sources import all_sources
from recaps.models import Event, RecapId, RecapStatus, RecapVideo
from recaps.selectors import recap_get
from recaps.services import (
    event_create,
    recap_checkout_create,
    recap_create,
    recap_redeem_free,
)

DEMO_BUYER = "demo-buyer"
FINAL = (RecapStatus.READY, RecapStatus.FAILED)
_PROBE_TIMEOUT = (1, 3)  # connect, read: one look at a local process
_PAY_TIMEOUT = (2, 30)  # the fake Stripe answers once our ingress has answered its webhook

# Where a recap stuck in a status is waiting, and which process moves it on.
HINTS = {
    RecapStatus.PENDING_PAYMENT: (
        "the payment webhook has not been handled: is the inbox worker running "
        "(manage.py process_inbox)? See the stripe raw events in the console"
    ),
    RecapStatus.PAID: (
        "no render was asked for yet: is the dispatcher running "
        "(manage.py dispatch_side_effects)? See the recap's side effect in the console"
    ),
    RecapStatus.RENDERING: (
        "the render service has not called back, or the inbox has not handled it yet: are "
        "run_fake_renderer and process_inbox running? See the renderer raw events"
    ),
}


class DemoUnavailable(Exception):
    """A process the demo needs does not answer (the message names it)."""


@dataclass(frozen=True)
class DemoRun:
    event: Event
    free_recap: RecapVideo
    paid_recap: RecapVideo
    checkout_url: str
    payment_event_id: str
    webhook_status: int | None


def demo_preflight(*, web_url: str) -> None:
    """Every process the demo goes through answers, or one line says which does not."""
    probes = [
        ("the web server", web_url.rstrip("/") + "/", "make run"),
        ("the fake Stripe", settings.STRIPE_API_BASE.rstrip("/") + "/", "make run"),
        ("the render service", settings.RENDER_SERVICE_URL.rstrip("/") + "/health", "make run"),
    ]
    if not settings.STRIPE_API_KEY:
        raise DemoUnavailable("STRIPE_API_KEY is not set (make run's .env sets a fake one)")
    for what, url, started_by in probes:
        try:
            requests.get(url, timeout=_PROBE_TIMEOUT)
        except requests.RequestException as exc:
            raise DemoUnavailable(
                f"{what} does not answer at {url} ({type(exc).__name__}): "
                f"start `{started_by}` in another shell first"
            ) from exc


@transaction.atomic
def demo_buyer_get_or_create() -> User:
    """The demo's buyer: a user who cannot sign in (no password)."""
    user, created = get_user_model().objects.get_or_create(
        username=DEMO_BUYER, defaults={"email": "demo-buyer@example.invalid"}
    )
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def demo_run(*, photos: int, now: datetime | None = None) -> DemoRun:
    """Create the demo's data and start both recaps on their way (does not wait)."""
    now = now or datetime.now(tz=UTC)
    buyer = demo_buyer_get_or_create()
    event = event_create(
        title=f"Demo event {now:%Y-%m-%d %H:%M:%S} UTC",
        photo_storage_keys=[f"demo/{now:%Y%m%dT%H%M%S}/photo-{n:02d}.jpg" for n in range(photos)],
    )
    # The free path: a recap redeemed without payment, through the payment's own service.
    free = recap_create(event=event, buyer=buyer, is_free=True)
    recap_redeem_free(recap_id=free.id, user=buyer)
    # The paid path: a Checkout Session through the SDK, then the buyer pays on its page.
    paid = recap_create(event=event, buyer=buyer)
    checkout = recap_checkout_create(recap=paid, buyer=buyer)
    try:
        response = requests.post(
            checkout.url, headers={"Accept": "application/json"}, timeout=_PAY_TIMEOUT
        )
        paid_answer = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise DemoUnavailable(
            f"paying on the checkout page {checkout.url} failed ({type(exc).__name__})"
        ) from exc
    if response.status_code != 200:
        raise DemoUnavailable(
            f"the checkout page {checkout.url} answered {response.status_code}: "
            f"{paid_answer.get('error', '')}"
        )
    return DemoRun(
        event=event,
        free_recap=recap_get(recap_id=free.id),
        paid_recap=recap_get(recap_id=paid.id),
        checkout_url=checkout.url,
        payment_event_id=str(paid_answer.get("event_id", "")),
        webhook_status=paid_answer.get("webhook_status"),
    )


def demo_wait(
    *,
    recap_ids: list[RecapId],
    timeout_seconds: float,
    on_change: Callable[[RecapVideo], None],
    poll_seconds: float = 0.25,
) -> dict[RecapId, RecapVideo]:
    """Poll until every recap is ready or failed, or the timeout; reports each change."""
    seen: dict[RecapId, str] = {}
    latest: dict[RecapId, RecapVideo] = {}
    deadline = time.monotonic() + timeout_seconds
    while True:
        for recap_id in recap_ids:
            recap = recap_get(recap_id=recap_id)
            latest[recap_id] = recap
            if seen.get(recap_id) != recap.status:
                seen[recap_id] = recap.status
                on_change(recap)
        if all(r.status in FINAL for r in latest.values()) or time.monotonic() >= deadline:
            return latest
        time.sleep(poll_seconds)


def demo_hint(recap: RecapVideo) -> str:
    return HINTS.get(RecapStatus(recap.status), "")


# --- a failing handler, to see an incident (fakes/failing.py) ---------------------------------


def demo_failing(*, web_url: str, events: int = 3) -> list[int]:
    """Post `events` signed GitHub webhooks that the demo's failing handler gives up on: one
    dead delivery each, one incident. Returns the raw event ids."""
    from fakes.failing import DEMO_FAILURE_EVENT, demo_failure

    if not any(spec.name == f"{demo_failure.__module__}.demo_failure" for spec in all_handlers()):
        raise DemoUnavailable(FAILING_OFF)
    secret = (all_sources()["github"].secrets or [""])[0]
    ids = []
    for n in range(events):
        body = json.dumps({"zen": "a demo failure", "n": n, "at": time.time()}).encode()
        signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        try:
            answer = requests.post(
                f"{web_url}/webhooks/github/",
                data=body,
                headers={
                    "Content-Type": "application/json",
                    "X-GitHub-Event": DEMO_FAILURE_EVENT,
                    "X-GitHub-Delivery": f"demo-failure-{uuid.uuid4()}",
                    "X-Hub-Signature-256": f"sha256={signature}",
                },
                timeout=_PAY_TIMEOUT,
            )
        except requests.RequestException as exc:
            raise DemoUnavailable(f"no web server at {web_url} ({type(exc).__name__})") from exc
        if answer.status_code != 202:
            raise DemoUnavailable(f"our ingress answered the failing webhook {answer.status_code}")
        ids.append(answer.json()["id"])
    return ids


def demo_failing_wait(*, raw_event_ids: list[int], timeout_seconds: float) -> int:
    """Wait until the events' deliveries are dead; returns how many are."""
    deadline = time.monotonic() + timeout_seconds
    dead = 0
    while time.monotonic() < deadline:
        dead = Delivery.objects.filter(raw_event_id__in=raw_event_ids, status="dead").count()
        if dead >= len(raw_event_ids):
            break
        time.sleep(0.5)
    return dead


FAILING_OFF = (
    "the failing handler is not registered here: run with DJANGO_DEBUG=1 (make run) or "
    "EVENTDROP_DEMO_FAILING_HANDLER=1, the inbox worker too"
)
