from typing import Any

from django.core.management.base import CommandError, CommandParser

from ingress.reconcile.command import ReconcileCommand
from ingress.reconcile.github import GitHubHook, github_reconcile
from ingress.reconcile.runs import ReconcileOutcome


class Command(ReconcileCommand):
    help = (
        "Compare a GitHub hook's deliveries (last 3 days at most) with the dedup index and "
        "ask GitHub to redeliver the ones we lack (GitHub never retries on its own). Records "
        "the run and its drift; also runs nightly for RECONCILE_GITHUB_HOOKS."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--hook-id", type=int, required=True, help="the webhook's id")
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument("--repo", help="owner/name of a repository hook")
        where.add_argument("--org", help="organization of an organization hook")
        parser.add_argument("--source", default="github", help="webhook source (default github)")

    def handle(
        self,
        *args: Any,
        hook_id: int,
        repo: str | None,
        org: str | None,
        source: str,
        dry_run: bool,
        fail_on_drift: bool,
        **options: Any,
    ) -> None:
        window = self.window_options(options)
        owner = repo or org
        if not owner:  # argparse requires one of the two; an empty one is no owner either
            raise CommandError("Give --repo owner/name or --org name.")

        def start() -> ReconcileOutcome:
            hook = GitHubHook(owner=owner, hook_id=hook_id)
            return github_reconcile(hook=hook, source=source, dry_run=dry_run, **window)

        self.run_reconciliation(start, fail_on_drift=fail_on_drift)
