from typing import Any

from django.core.management.base import BaseCommand

from ingress.deliveries.pace import handler_limits
from ingress.handlers import all_handlers


class Command(BaseCommand):
    help = (
        "List every registered webhook handler: provider, event types, dotted name, and its "
        "limits (after HANDLER_LIMITS)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        specs = all_handlers()
        if not specs:
            self.stdout.write("no handlers registered")
        for spec in specs:
            types = ", ".join(sorted(spec.event_types))
            limits = handler_limits(spec)
            shown = [
                f"rate {limits.rate:g}/s" if limits.rate is not None else "",
                f"concurrency {limits.concurrency}" if limits.concurrency is not None else "",
            ]
            line = f"{spec.provider:<10} {types:<60} {spec.name}"
            if any(shown):
                line += f" ({', '.join(part for part in shown if part)})"
            self.stdout.write(line)
