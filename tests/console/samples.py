"""One sample row per model that has a console admin, for the admin walk tests.

Every model registered on the admin by this project's apps needs an entry here: the walk
test fails for a model without one, so a new admin cannot dodge the "every action runs"
check by having nothing to act on.
"""

import uuid
from collections.abc import Callable
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from console.models import OperatorAction, PayloadAccess
from ingress.inbox import inbox_run_once
from ingress.models import (
    Delivery,
    DeliveryAttempt,
    RawEvent,
    ReconciliationRun,
    ReconciliationStatus,
)
from ingress.reconcile.services import (
    Tally,
    reconciliation_run_finish,
    reconciliation_run_start,
)
from ingress.reconcile.window import Window
from outbox.models import CircuitBreaker, RecapSideEffect
from recaps.models import Event, Photo, RecapVideo
from recaps.services import recap_mark_paid
from tests.console.conftest import receive_github


def verified_event(client, user) -> RawEvent:
    event = receive_github(client, {"ref": "refs/heads/sample"}, delivery="sample-1")
    inbox_run_once()
    event.refresh_from_db()
    return event


def delivery(client, user) -> Delivery:
    event = RawEvent.objects.create(
        source="github",
        provider="github",
        method="POST",
        path="/webhooks/github/",
        headers={},
        body=b"{}",
        body_sha256="0" * 64,
    )
    now = timezone.now()
    row = Delivery.objects.create(
        raw_event=event,
        handler="tests.sample",
        status="dead",
        attempts=1,
        finished_at=now,
        last_error="boom",
    )
    DeliveryAttempt.objects.create(
        delivery=row, number=1, started_at=now, finished_at=now, outcome="dead", error="boom"
    )
    return row


def operator_action(client, user) -> OperatorAction:
    return OperatorAction.objects.create(
        actor=user,
        actor_username=user.get_username(),
        action="raw_event_replay",
        via="api",
        target_model="ingress.rawevent",
        target_ids=[1],
        requested=1,
        succeeded=1,
        outcome="succeeded",
        finished_at=timezone.now(),
        results=[{"id": 1, "outcome": "ok", "detail": "1 deliveries queued"}],
    )


def payload_access(client, user) -> PayloadAccess:
    return PayloadAccess.objects.create(
        actor=user,
        actor_username=user.get_username(),
        kind="search",
        via="admin",
        search_term="cs_test_sample",
    )


def paid_recap(client, user, *, photos: int = 6) -> RecapVideo:
    """A paid recap with its render side effect pending, through the real payment service."""
    event = Event.objects.create(title="Summer party")
    Photo.objects.bulk_create(
        Photo(event=event, storage_key=f"events/{event.pk}/photo-{n}.jpg") for n in range(photos)
    )
    buyer = get_user_model().objects.create_user(f"buyer-{uuid.uuid4().hex[:8]}")
    recap = RecapVideo.objects.create(event=event, buyer=buyer)
    recap_mark_paid(recap_id=recap.id, payment_reference=f"pi_{recap.id.hex[:12]}")
    recap.refresh_from_db()
    return recap


def event(client, user) -> Event:
    return Event.objects.create(title="Sample party")


def photo(client, user) -> Photo:
    return Photo.objects.create(event=event(client, user), storage_key="events/sample/p-1.jpg")


def side_effect(client, user) -> RecapSideEffect:
    return RecapSideEffect.objects.get(recap=paid_recap(client, user))


def circuit_breaker(client, user) -> CircuitBreaker:
    return CircuitBreaker.objects.create(name="render-service-sample")


def reconciliation_run(client, user) -> ReconciliationRun:
    """A finished Stripe run that found and backfilled one missing event."""
    now = timezone.now()
    run = reconciliation_run_start(
        provider="stripe",
        source="stripe",
        scope="",
        window=Window(since=now - timedelta(days=2), until=now - timedelta(minutes=10)),
    )
    tally = Tally(pages=1, backfilled_count=1)
    tally.add(known=9, pending=0, missing=["evt_sample"])
    return reconciliation_run_finish(run=run, tally=tally, status=ReconciliationStatus.COMPLETE)


SAMPLES: dict[str, Callable] = {
    "outbox.recapsideeffect": side_effect,
    "outbox.circuitbreaker": circuit_breaker,
    "recaps.recapvideo": paid_recap,
    "recaps.event": event,
    "recaps.photo": photo,
    "ingress.rawevent": verified_event,
    "ingress.delivery": delivery,
    "ingress.reconciliationrun": reconciliation_run,
    "console.operatoraction": operator_action,
    "console.payloadaccess": payload_access,
}
