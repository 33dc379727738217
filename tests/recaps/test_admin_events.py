"""Events and photos in the admin: an operator can list, enter and correct them, and start a
free recap of an event for themselves (through the recap services)."""

import pytest
from django.contrib.auth import get_user_model

from outbox.models import RecapSideEffect
from recaps.models import Event, RecapStatus, RecapVideo
from tests.recaps.factories import EventFactory, RecapFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_superuser("operator", "op@example.invalid", "pw")
    client.force_login(user)
    return user


def test_events_list_with_their_photo_and_recap_counts(client, operator):
    event = EventFactory.create(title="Harbour night")
    RecapFactory.create(event=event)
    response = client.get("/admin/recaps/event/")
    assert response.status_code == 200
    assert "Harbour night" in response.content.decode()
    assert client.get(f"/admin/recaps/event/{event.pk}/change/").status_code == 200
    assert client.get("/admin/recaps/photo/").status_code == 200


def test_an_event_and_its_photos_are_entered_in_one_form(client, operator):
    response = client.post(
        "/admin/recaps/event/add/",
        {
            "title": "Rooftop",
            "created_at_0": "2026-12-01",
            "created_at_1": "10:00:00",
            "photos-TOTAL_FORMS": "2",
            "photos-INITIAL_FORMS": "0",
            "photos-0-storage_key": "events/rooftop/1.jpg",
            "photos-1-storage_key": "events/rooftop/2.jpg",
            "recaps-TOTAL_FORMS": "0",
            "recaps-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    event = Event.objects.get(title="Rooftop")
    assert sorted(event.photos.values_list("storage_key", flat=True)) == [
        "events/rooftop/1.jpg",
        "events/rooftop/2.jpg",
    ]


def test_an_event_with_recaps_cannot_be_deleted(client, operator):
    event = EventFactory.create()
    RecapFactory.create(event=event)
    assert client.get(f"/admin/recaps/event/{event.pk}/delete/").status_code == 403


def test_a_free_recap_of_an_event_for_the_operator(client, operator):
    event = EventFactory.create()
    response = client.post(
        "/admin/recaps/event/",
        {"action": "free_recap_for_me", "_selected_action": [event.pk]},
        follow=True,
    )
    assert response.status_code == 200
    recap = RecapVideo.objects.get(event=event)
    assert recap.buyer == operator and recap.is_free and recap.status == RecapStatus.PAID
    assert RecapSideEffect.objects.filter(recap=recap).count() == 1  # queued for the dispatcher
    assert "queued for rendering" in response.content.decode()
