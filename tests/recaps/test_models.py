"""The recap's status rules are database constraints, not Python hopes."""

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from outbox.models import RecapSideEffect
from recaps.models import RecapVideo
from tests.recaps.factories import RecapFactory

pytestmark = pytest.mark.django_db


def violates(name: str, **changes) -> None:
    recap = RecapFactory.create()
    with pytest.raises(IntegrityError, match=name), transaction.atomic():
        RecapVideo.objects.filter(pk=recap.pk).update(**changes)


def test_status_must_be_known():
    violates("recap_status_valid", status="lost", paid_at=timezone.now(), payment_reference="p")


def test_failed_has_a_reason_and_nothing_else_does():
    now = timezone.now()
    violates(
        "recap_failed_has_reason",
        status="failed",
        failed_at=now,
        paid_at=now,
        payment_reference="pi_1",
    )
    violates("recap_failed_has_reason", failure_reason="stale reason")


def test_ready_has_a_video():
    now = timezone.now()
    violates(
        "recap_ready_has_video", status="ready", ready_at=now, paid_at=now, payment_reference="pi_1"
    )


def test_paid_has_a_payment_or_is_free():
    violates("recap_paid_has_payment", status="paid", paid_at=timezone.now())


def test_a_free_recap_carries_no_payment():
    violates("recap_free_has_no_payment", is_free=True, payment_reference="pi_1")


def test_one_payment_pays_one_recap():
    RecapFactory.create(payment_reference="pi_same")
    with pytest.raises(IntegrityError, match="recap_payment_reference_unique"):
        RecapFactory.create(payment_reference="pi_same")


def test_one_side_effect_per_recap_and_type():
    recap = RecapFactory.create()
    RecapSideEffect.objects.create(recap=recap, effect_type="render")
    with pytest.raises(IntegrityError, match="recap_side_effect_unique"), transaction.atomic():
        RecapSideEffect.objects.create(recap=recap, effect_type="render")
    with pytest.raises(IntegrityError, match="recap_side_effect_status_valid"):
        RecapSideEffect.objects.filter(recap=recap).update(status="lost")


def test_side_effect_defaults_are_in_the_database_too():
    from django.db import connection

    recap = RecapFactory.create()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO recap_side_effects (recap_id, effect_type, key_generation, last_error,"
            " last_error_class, created_at, updated_at) VALUES (%s, 'render', 0, '', '', %s, %s)",
            [recap.pk, timezone.now(), timezone.now()],
        )
    row = RecapSideEffect.objects.get(recap=recap)
    assert (row.status, row.attempts) == ("pending", 0)
    assert row.next_attempt_at is not None
