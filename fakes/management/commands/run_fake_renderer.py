from django.conf import settings
from django.core.management.base import BaseCommand

from fakes.local_service import sender_secret
from fakes.renderer import MODES, FakeRenderer


class Command(BaseCommand):
    # A stand-in for another service: it needs the callback secret, not this app's checks
    # (which would refuse it where the dispatcher's configuration is incomplete).
    requires_system_checks: list[str] = []
    help = (
        "Run the fake render service on 127.0.0.1 (local development and demos). Switch its "
        'failure mode at runtime: curl -X POST localhost:8200/_control -d \'{"mode": "down"}\''
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8200)
        parser.add_argument("--mode", choices=MODES, default="ok")
        parser.add_argument(
            "--complete-after", type=float, default=2.0, help="seconds until the callback"
        )
        parser.add_argument("--delay", type=float, default=5.0, help="slow/hang wait (s)")
        parser.add_argument("--no-callbacks", action="store_true")

    def handle(self, *args, port, mode, complete_after, delay, no_callbacks, **options):
        fake = FakeRenderer(
            secret=sender_secret(settings.RENDER_WEBHOOK_SOURCE),
            port=port,
            complete_after=complete_after,
            callbacks=not no_callbacks,
        )
        fake.configure(mode=mode, delay=delay)
        self.stdout.write(f"fake render service on {fake.url} (mode {mode}); Ctrl-C to stop")
        fake.serve_until_interrupted()
        self.stdout.write("fake render service stopped")
