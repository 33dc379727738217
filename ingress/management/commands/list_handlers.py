from typing import Any

from django.core.management.base import BaseCommand

from ingress.handlers import all_handlers


class Command(BaseCommand):
    help = "List every registered webhook handler: provider, event types, dotted name."

    def handle(self, *args: Any, **options: Any) -> None:
        specs = all_handlers()
        if not specs:
            self.stdout.write("no handlers registered")
        for spec in specs:
            types = ", ".join(sorted(spec.event_types))
            self.stdout.write(f"{spec.provider:<10} {types:<60} {spec.name}")
