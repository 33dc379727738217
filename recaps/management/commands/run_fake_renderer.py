import os

from django.core.management.base import BaseCommand, CommandError

from recaps.fake_renderer import MODES, FakeRenderer


class Command(BaseCommand):
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
        secret = os.environ.get("RENDERER_WEBHOOK_SECRET", "")
        if not secret:
            raise CommandError("RENDERER_WEBHOOK_SECRET is not set: callbacks cannot be signed.")
        fake = FakeRenderer(
            secret=secret, port=port, complete_after=complete_after, callbacks=not no_callbacks
        )
        fake.configure(mode=mode, delay=delay)
        self.stdout.write(f"fake render service on {fake.url} (mode {mode}); Ctrl-C to stop")
        try:
            fake.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            fake.stopping.set()
            fake._server.server_close()
            self.stdout.write("fake render service stopped")
