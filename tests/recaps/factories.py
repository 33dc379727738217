"""Model factories for the recap tests.

Typed by their model (DjangoModelFactory[Model]): call them as `RecapFactory.create(...)` where
mypy should know the result is a RecapVideo. A plain `RecapFactory(...)` builds the same row,
but factory_boy's metaclass hides that from the type checker (it sees a RecapFactory).
"""

from typing import Any

import factory
from django.contrib.auth.models import User

from recaps.models import Event, Photo, RecapVideo


class UserFactory(factory.django.DjangoModelFactory[User]):
    class Meta:
        model = User  # settings.AUTH_USER_MODEL is Django's own
        skip_postgeneration_save = True
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"buyer{n}")
    password = factory.django.Password("pw-for-tests")


class EventFactory(factory.django.DjangoModelFactory[Event]):
    class Meta:
        model = Event
        skip_postgeneration_save = True

    title = factory.Sequence(lambda n: f"Summer party {n}")

    @factory.post_generation
    def photos(event: Event, create: bool, extracted: int | None, **kwargs: Any) -> None:
        count = 6 if extracted is None else extracted
        if create:
            Photo.objects.bulk_create(
                Photo(event=event, storage_key=f"events/{event.pk}/photo-{n}.jpg")
                for n in range(count)
            )


class RecapFactory(factory.django.DjangoModelFactory[RecapVideo]):
    class Meta:
        model = RecapVideo

    event = factory.SubFactory(EventFactory)
    buyer = factory.SubFactory(UserFactory)
