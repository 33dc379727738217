from django.core.management.base import BaseCommand

from outbox.services import outbox_recover


class Command(BaseCommand):
    help = (
        "Nightly recovery: create the missing render row of every paid recap, re-arm rows "
        "stuck in processing, count recaps stuck rendering. Triggers no render itself."
    )

    def handle(self, *args, **options):
        self.stdout.write(f"recover_recaps: {outbox_recover().summary()}")
