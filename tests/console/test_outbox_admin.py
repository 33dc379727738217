"""The outbox and recap console: find dead or stuck side effects, re-arm, mark dead, retry."""

import pytest
from django.contrib.admin import helpers
from django.urls import reverse
from rest_framework.test import APIClient

from console.models import OperatorAction
from console.services import NOTE_REQUIRED
from outbox.dispatcher import dispatch_run
from outbox.errors import SIDE_EFFECT_ALREADY_DONE
from outbox.models import RecapSideEffect
from recaps.errors import RECAP_NOT_RETRYABLE
from recaps.models import RecapStatus, RecapVideo
from tests.console.samples import paid_recap

pytestmark = pytest.mark.django_db

SIDE_EFFECTS = "/admin/outbox/recapsideeffect/"
RECAPS = "/admin/recaps/recapvideo/"


def listed_ids(response) -> list:
    return [obj.pk for obj in response.context["cl"].result_list]


def post_action(client, url, action, objects, **extra):
    return client.post(
        url,
        {"action": action, helpers.ACTION_CHECKBOX_NAME: [str(o.pk) for o in objects], **extra},
    )


def messages_of(response) -> list[str]:
    return [str(m) for m in response.wsgi_request._messages]


def test_a_dead_row_shows_its_full_error_history(admin_client, dead_side_effect):
    url = reverse("admin:outbox_recapsideeffect_change", args=[dead_side_effect.pk])
    page = admin_client.get(url).content.decode()
    # A verdict about this request (the service's 422) ended it at its first attempt.
    assert page.count("The render service answered HTTP 422.") >= 2
    assert page.count("http_422") >= 2
    assert "render request gave up after 1 attempt(s)" in page  # the recap's reason


@pytest.mark.parametrize(
    ("query", "matches"),
    [
        ("status__exact=dead", True),
        ("status__exact=pending", False),
        ("last_error_class=http_422", True),
        ("last_error_class=http_500", False),
        ("attempts=1", True),
        ("attempts=5%2B", False),
        ("state_age=1d", False),
        ("q=nonsense", False),
    ],
)
def test_side_effect_filters(admin_client, dead_side_effect, query, matches):
    response = admin_client.get(f"{SIDE_EFFECTS}?{query}")
    assert response.status_code == 200
    assert listed_ids(response) == ([dead_side_effect.pk] if matches else [])


def test_search_side_effects_by_recap_id(admin_client, dead_side_effect):
    response = admin_client.get(SIDE_EFFECTS, {"q": str(dead_side_effect.recap_id)})
    assert listed_ids(response) == [dead_side_effect.pk]


def test_rearm_a_dead_row_and_it_is_dispatched(
    admin_client, admin_user, dead_side_effect, fake_renderer
):
    confirm = post_action(
        admin_client, SIDE_EFFECTS, "rearm_selected", [dead_side_effect], index="0"
    )
    page = confirm.content.decode()
    assert "This will touch 1 recap side effect." in page and "<td>dead</td>" in page

    response = post_action(
        admin_client, SIDE_EFFECTS, "rearm_selected", [dead_side_effect], post="yes"
    )
    assert messages_of(response)[0].startswith("Re-arm: 1 succeeded")
    record = OperatorAction.objects.get()
    assert (record.action, record.actor, record.succeeded) == ("side_effect_rearm", admin_user, 1)
    dead_side_effect.refresh_from_db()
    assert (dead_side_effect.status, dead_side_effect.attempts) == ("pending", 0)
    assert RecapVideo.objects.get().status == RecapStatus.PAID

    url = reverse("admin:outbox_recapsideeffect_change", args=[dead_side_effect.pk])
    assert "re-arm side effects by <strong>admin</strong>" in admin_client.get(url).content.decode()

    dispatch_run()
    dead_side_effect.refresh_from_db()
    assert dead_side_effect.status == "done"
    assert RecapVideo.objects.get().status == RecapStatus.RENDERING


def test_rearming_a_done_row_is_refused_clearly(admin_client, admin_user, client, fake_renderer):
    recap = paid_recap(client, admin_user)
    dispatch_run()
    row = RecapSideEffect.objects.get(recap=recap)
    assert row.status == "done"
    response = post_action(admin_client, SIDE_EFFECTS, "rearm_selected", [row], post="yes")
    assert f"#{row.pk}: {SIDE_EFFECT_ALREADY_DONE.format(id=row.pk)}" in messages_of(response)
    assert OperatorAction.objects.get().outcome == "refused"


def test_mark_dead_needs_a_reason_which_is_recorded(admin_client, admin_user, client):
    recap = paid_recap(client, admin_user)
    row = RecapSideEffect.objects.get(recap=recap)
    page = post_action(admin_client, SIDE_EFFECTS, "mark_dead_selected", [row], index="0")
    assert 'name="note"' in page.content.decode()

    again = post_action(admin_client, SIDE_EFFECTS, "mark_dead_selected", [row], post="yes")
    assert again.status_code == 200 and NOTE_REQUIRED in again.content.decode()
    assert not OperatorAction.objects.exists()

    done = post_action(
        admin_client,
        SIDE_EFFECTS,
        "mark_dead_selected",
        [row],
        post="yes",
        note="event deleted by the organiser",
    )
    assert done.status_code == 302
    row.refresh_from_db()
    recap.refresh_from_db()
    assert row.status == "dead"
    assert recap.status == "failed"
    assert recap.failure_reason == "marked dead by an operator: event deleted by the organiser"
    assert OperatorAction.objects.get().note == "event deleted by the organiser"


def test_recap_list_shows_status_payment_and_render_state(admin_client, dead_side_effect):
    response = admin_client.get(RECAPS)
    page = response.content.decode()
    assert response.status_code == 200
    assert "failed" in page and "pi_" in page
    assert 'field-render_state"><span class="console-badge console-tone-bad">dead</span>' in page
    recap = RecapVideo.objects.get()
    detail = admin_client.get(reverse("admin:recaps_recapvideo_change", args=[recap.pk]))
    assert "attempts and errors" in detail.content.decode()
    assert listed_ids(admin_client.get(RECAPS, {"q": recap.payment_reference})) == [recap.pk]
    assert listed_ids(admin_client.get(RECAPS, {"q": str(recap.pk)})) == [recap.pk]


def test_retry_render_of_a_failed_recap(
    admin_client, dead_side_effect, fake_renderer, client, admin_user
):
    unpaid = RecapVideo.objects.create(event=RecapVideo.objects.get().event, buyer=admin_user)
    failed = RecapVideo.objects.get(status="failed")
    response = post_action(
        admin_client, RECAPS, "retry_render_selected", [failed, unpaid], post="yes"
    )
    messages = messages_of(response)
    assert messages[0].startswith("Retry render: 1 succeeded, 1 refused")
    assert f"#{unpaid.pk}: {RECAP_NOT_RETRYABLE}" in messages
    failed.refresh_from_db()
    assert failed.status == "paid"
    dispatch_run()
    failed.refresh_from_db()
    assert failed.status == "rendering"


def test_api_rearm(operator, dead_side_effect):
    from tests.console.conftest import grant

    api = APIClient()
    api.force_authenticate(operator)
    response = api.post("/api/side-effects/rearm/", {"ids": [dead_side_effect.pk]}, format="json")
    assert response.status_code == 200, response.content
    [result] = response.json()["results"]
    assert result == {
        "id": dead_side_effect.pk,
        "outcome": "ok",
        "detail": "re-armed: pending, due now",
        "status": "pending",
        "recap_id": str(dead_side_effect.recap_id),
    }
    bad = api.post("/api/side-effects/rearm/", {"ids": [987654]}, format="json")
    assert bad.status_code == 400
    assert bad.json()["errors"] == {"ids": ["Unknown recap side effect ids: 987654."]}
    api.force_authenticate(grant(operator, "console.view_ops"))
    depths = api.get("/api/queues/").json()
    assert depths["outbox"]["pending"] == 1 and depths["outbox"]["due"] == 1


def test_api_rearm_needs_the_operate_permission(django_user_model, dead_side_effect):
    from tests.console.conftest import grant

    viewer = grant(
        django_user_model.objects.create_user("viewer", is_staff=True), "ingress.view_rawevent"
    )
    api = APIClient()
    api.force_authenticate(viewer)
    response = api.post("/api/side-effects/rearm/", {"ids": [dead_side_effect.pk]}, format="json")
    assert response.status_code == 403
