"""One sample row per model that has a console admin, for the admin walk tests.

Every model registered on the admin by this project's apps needs an entry here: the walk
test fails for a model without one, so a new admin cannot dodge the "every action runs"
check by having nothing to act on.
"""

from collections.abc import Callable

from django.utils import timezone

from console.models import OperatorAction
from ingress.inbox import inbox_run_once
from ingress.models import Delivery, DeliveryAttempt, RawEvent
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


SAMPLES: dict[str, Callable] = {
    "ingress.rawevent": verified_event,
    "ingress.delivery": delivery,
    "console.operatoraction": operator_action,
}
