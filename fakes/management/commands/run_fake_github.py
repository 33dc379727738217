import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from fakes.github import FakeGitHub
from fakes.local_service import sender_secret


class Command(BaseCommand):
    # A stand-in for another service: it needs the webhook secret, not this app's checks.
    requires_system_checks: list[str] = []
    help = (
        "Run the fake GitHub on 127.0.0.1: it sends signed webhooks to our ingress "
        "(POST /_fake/deliver) and lists every delivery as GitHub's hook deliveries API does "
        "(GITHUB_API_BASE points here, GITHUB_API_TOKEN is its token)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8400)
        parser.add_argument("--page-size", type=int, default=100)
        parser.add_argument(
            "--webhook-url",
            default=None,
            help="where deliveries are POSTed "
            "(default http://127.0.0.1:$PORT/webhooks/github/, PORT being our web server's)",
        )

    def handle(
        self, *args: Any, port: int, page_size: int, webhook_url: str | None, **options: Any
    ) -> None:
        webhook_url = (
            webhook_url or f"http://127.0.0.1:{os.environ.get('PORT') or 8000}/webhooks/github/"
        )
        fake = FakeGitHub(
            token=settings.GITHUB_API_TOKEN,
            page_size=page_size,
            port=port,
            webhook_url=webhook_url,
            webhook_secret=sender_secret("github"),
        )
        self.stdout.write(f"fake GitHub on {fake.url}, webhooks to {webhook_url}; Ctrl-C to stop")
        fake.serve_until_interrupted()
        self.stdout.write("fake GitHub stopped")
