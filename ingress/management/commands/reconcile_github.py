from ingress.reconcile.command import ReconcileCommand
from ingress.reconcile.github import GitHubHook, github_reconcile


class Command(ReconcileCommand):
    help = (
        "Compare a GitHub hook's deliveries (last 3 days at most) with the dedup index and "
        "ask GitHub to redeliver the ones we lack (GitHub never retries on its own). Records "
        "the run and its drift; also runs nightly for RECONCILE_GITHUB_HOOKS."
    )

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--hook-id", type=int, required=True, help="the webhook's id")
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument("--repo", help="owner/name of a repository hook")
        where.add_argument("--org", help="organization of an organization hook")
        parser.add_argument("--source", default="github", help="webhook source (default github)")

    def handle(self, *args, hook_id, repo, org, source, dry_run, fail_on_drift, **options):
        window = self.window_options(options)

        def start():
            hook = GitHubHook(owner=repo or org, hook_id=hook_id)
            return github_reconcile(hook=hook, source=source, dry_run=dry_run, **window)

        self.run_reconciliation(start, fail_on_drift=fail_on_drift)
