import os

from django.conf import settings
from django.core.management.base import BaseCommand

from fakes.local_service import sender_secret
from fakes.stripe import FakeStripe


class Command(BaseCommand):
    # A stand-in for another service: it needs the webhook secret, not this app's checks.
    requires_system_checks: list[str] = []
    help = (
        "Run the fake Stripe on 127.0.0.1 (local development and `manage.py demo`): Checkout "
        "Sessions for the stripe SDK (STRIPE_API_BASE points here), and a checkout page whose "
        "payment sends a signed checkout.session.completed to our own ingress."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8300)
        parser.add_argument(
            "--webhook-url",
            default=None,
            help="where completed checkouts are POSTed "
            "(default FAKE_STRIPE_WEBHOOK_URL, else http://127.0.0.1:$PORT/webhooks/stripe/)",
        )

    def handle(self, *args, port, webhook_url, **options):
        webhook_url = (
            webhook_url
            or os.environ.get("FAKE_STRIPE_WEBHOOK_URL")
            or f"http://127.0.0.1:{os.environ.get('PORT') or 8000}/webhooks/stripe/"
        )
        fake = FakeStripe(
            port=port, webhook_url=webhook_url, webhook_secret=sender_secret("stripe")
        )
        if settings.STRIPE_API_BASE.rstrip("/") != fake.url:
            self.stderr.write(
                f"note: STRIPE_API_BASE is {settings.STRIPE_API_BASE}, not this fake ({fake.url})"
            )
        self.stdout.write(f"fake Stripe on {fake.url}, webhooks to {webhook_url}; Ctrl-C to stop")
        fake.serve_until_interrupted()
        self.stdout.write("fake Stripe stopped")
