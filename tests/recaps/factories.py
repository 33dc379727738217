import factory
from django.contrib.auth import get_user_model

from recaps.models import Event, Photo, RecapVideo


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"buyer{n}")
    password = factory.django.Password("pw-for-tests")


class EventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Event
        skip_postgeneration_save = True

    title = factory.Sequence(lambda n: f"Summer party {n}")

    @factory.post_generation
    def photos(self, create, extracted, **kwargs):
        count = 6 if extracted is None else extracted
        if create:
            Photo.objects.bulk_create(
                Photo(event=self, storage_key=f"events/{self.pk}/photo-{n}.jpg")
                for n in range(count)
            )


class RecapFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = RecapVideo

    event = factory.SubFactory(EventFactory)
    buyer = factory.SubFactory(UserFactory)
