from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone
from django_q.models import Schedule

from kernel.schedules import SCHEDULES, Recurring


def next_daily_run(recurring: Recurring, now: datetime) -> datetime:
    if recurring.daily_at is None:
        raise ValueError(f"schedule {recurring.name} has no daily_at")
    today = datetime.combine(now.astimezone(UTC).date(), recurring.daily_at, tzinfo=UTC)
    return today if today > now else today + timedelta(days=1)


class Command(BaseCommand):
    help = "Create or update the django-q2 schedules declared in kernel/schedules.py."

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        for recurring in SCHEDULES:
            schedule, created = Schedule.objects.update_or_create(
                name=recurring.name,
                defaults={
                    "func": recurring.func,
                    "schedule_type": recurring.schedule_type,
                    "minutes": recurring.minutes,
                    "repeats": -1,
                },
            )
            # Only a new schedule gets its first run; an existing one keeps its rhythm across
            # deploys (re-aligning it on every release would skip or double a night).
            if created and recurring.daily_at is not None:
                schedule.next_run = next_daily_run(recurring, now)
                schedule.save(update_fields=["next_run"])
            verb = "created" if created else "updated"
            self.stdout.write(
                f"{verb} schedule {recurring.name} -> {recurring.func} "
                f"(next run {schedule.next_run:%Y-%m-%d %H:%M} UTC)"
            )
