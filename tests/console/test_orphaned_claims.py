"""The operator's way out of a claim whose worker is gone (docs/queue.md, "An operator's way
out"): a `processing` delivery or side effect is re-armed from the console and the API once its
holder has stopped beating, audited; while its holder lives, the re-arm is refused and
recorded, and the row is left to its worker."""

from datetime import timedelta

import pytest
from django.utils import timezone

from console.models import OperatorAction
from ingress.deliveries import deliveries_claim
from ingress.inbox import raw_events_verify_batch
from ingress.models import Delivery
from kernel.models import ClaimHolder
from kernel.queue import Holder
from outbox.models import RecapSideEffect
from outbox.services import side_effects_claim
from tests.ingress.test_inbox import receive_github
from tests.recaps.fixtures import paid_recap  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def silence(holder: Holder) -> None:
    """Its process died a while ago: its last beat is older than the TTL."""
    ClaimHolder.objects.filter(id=holder.id).update(beat_at=timezone.now() - timedelta(hours=1))


def processing_delivery(client) -> tuple[Delivery, Holder]:
    receive_github(client)
    raw_events_verify_batch()
    holder = Holder.new()
    [claim] = deliveries_claim(limit=10, now=timezone.now(), holder=holder)
    return Delivery.objects.get(id=claim.id), holder


def rearm_via_api(client, operator, path: str, pk: int) -> dict:
    client.force_login(operator)
    response = client.post(path, {"ids": [pk]}, content_type="application/json")
    assert response.status_code == 200, response.content
    return response.json()


def test_a_delivery_is_left_to_its_live_worker_and_taken_back_once_it_is_gone(
    client, operator, push_handler
):
    delivery, holder = processing_delivery(client)

    refused = rearm_via_api(client, operator, "/api/deliveries/rearm/", delivery.pk)
    assert refused["outcome"] == "refused"
    assert refused["results"][0]["detail"] == "running under a worker that lives: left to it"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.claimed_by) == ("processing", holder.id)

    silence(holder)
    done = rearm_via_api(client, operator, "/api/deliveries/rearm/", delivery.pk)
    assert done["outcome"] == "succeeded"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.claimed_by, delivery.attempts) == ("pending", None, 0)
    assert delivery.worker_deaths == 1  # its worker died with it: counted, as the pass would
    # Both tries are in the audit trail, with who did them.
    actions = OperatorAction.objects.filter(action="delivery_rearm").order_by("id")
    assert [(a.actor_username, a.outcome) for a in actions] == [
        ("operator", "refused"),
        ("operator", "succeeded"),
    ]


def test_a_side_effect_is_left_to_its_live_dispatcher_and_taken_back_once_it_is_gone(
    client,
    operator,
    paid_recap,  # noqa: F811 (the fixture)
):
    _, side_effect = paid_recap()
    holder = Holder.new()
    RecapSideEffect.objects.claim(limit=1, now=timezone.now(), holder=holder)
    assert side_effects_claim(limit=1) == []  # (claimed: nothing else due)

    refused = rearm_via_api(client, operator, "/api/side-effects/rearm/", side_effect.pk)
    assert refused["outcome"] == "refused"
    assert "by a worker that lives" in refused["results"][0]["detail"]

    silence(holder)
    done = rearm_via_api(client, operator, "/api/side-effects/rearm/", side_effect.pk)
    assert done["outcome"] == "succeeded"
    side_effect.refresh_from_db()
    assert (side_effect.status, side_effect.claimed_by, side_effect.attempts) == (
        "pending",
        None,
        0,
    )
    outcomes = list(side_effect.history.values_list("outcome", flat=True))
    assert outcomes == ["rearmed_stale", "rearmed"]


def test_the_admin_offers_the_rearm_on_a_processing_delivery(client, operator, push_handler):
    delivery, _ = processing_delivery(client)
    client.force_login(operator)
    page = client.get(f"/admin/ingress/delivery/{delivery.pk}/change/")
    assert page.status_code == 200
    assert b'id="console-rearm"' in page.content
