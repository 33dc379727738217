from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from ingress.sources import all_sources
from recaps.fake_renderer import MODES, FakeRenderer


def current_renderer_secret() -> str:
    """The secret a sender signs with: the first of the renderer source's secrets.

    During a rotation RENDERER_WEBHOOK_SECRET holds "new,old": the ingress accepts either,
    a sender signs with the current one. Parsed by the ingress's own source configuration,
    so both sides read the variable the same way.
    """
    try:
        source = all_sources().get(settings.RENDER_WEBHOOK_SOURCE)
    except ImproperlyConfigured as exc:
        raise CommandError(f"webhook sources are misconfigured: {exc}") from exc
    if source is None or not source.secrets:
        env = source.secrets_env if source else "RENDERER_WEBHOOK_SECRET"
        raise CommandError(f"{env} is not set: callbacks cannot be signed.")
    return source.secrets[0]


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
            secret=current_renderer_secret(),
            port=port,
            complete_after=complete_after,
            callbacks=not no_callbacks,
        )
        fake.configure(mode=mode, delay=delay)
        self.stdout.write(f"fake render service on {fake.url} (mode {mode}); Ctrl-C to stop")
        fake.serve_until_interrupted()
        self.stdout.write("fake render service stopped")
