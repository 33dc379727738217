from django.core.management.base import BaseCommand
from django.db import transaction
from django_q.models import Schedule

from eventdrop.schedules import SCHEDULES


class Command(BaseCommand):
    help = "Create or update the django-q2 schedules declared in eventdrop/schedules.py."

    @transaction.atomic
    def handle(self, *args, **options):
        for name, func, schedule_type, minutes in SCHEDULES:
            _, created = Schedule.objects.update_or_create(
                name=name,
                defaults={
                    "func": func,
                    "schedule_type": schedule_type,
                    "minutes": minutes,
                    "repeats": -1,
                },
            )
            self.stdout.write(f"{'created' if created else 'updated'} schedule {name} -> {func}")
