"""Issue, list and revoke the tokens scripts use for the console API.

    manage.py api_token issue oncall-bot [--ttl-days 30]   # prints the token once
    manage.py api_token list [oncall-bot]
    manage.py api_token revoke oncall-bot [--key 3f9a1c0d2e4b5a6]

Tokens are stored only as SHA-512 digests (django-rest-knox): a lost token cannot be shown
again, only revoked and replaced. The token's first 15 characters (its key) name it.
"""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from console.selectors import api_token_list
from console.services import OperatorActionError, api_token_issue, api_token_revoke


class Command(BaseCommand):
    help = "Issue, list or revoke console API tokens (stored hashed, with an expiry)."

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="action", required=True)
        issue = commands.add_parser("issue", help="a new token for a staff user")
        issue.add_argument("username")
        issue.add_argument(
            "--ttl-days",
            type=int,
            default=settings.API_TOKEN_TTL_DAYS,
            help=f"days until it expires (default {settings.API_TOKEN_TTL_DAYS})",
        )
        listing = commands.add_parser("list", help="live tokens: key, user, created, expiry")
        listing.add_argument("username", nargs="?", default="")
        revoke = commands.add_parser("revoke", help="delete a user's tokens")
        revoke.add_argument("username")
        revoke.add_argument("--key", default="", help="only the token starting with this key")

    def _user(self, username: str):
        try:
            return get_user_model().objects.get_by_natural_key(username)
        except get_user_model().DoesNotExist as exc:
            raise CommandError(f"No user {username!r}.") from exc

    def handle(self, *args, action: str, username: str, **options):
        if action == "list":
            for token in api_token_list(username=username):
                expires = f"expires {token.expiry:%Y-%m-%dT%H:%MZ}" if token.expiry else "no expiry"
                self.stdout.write(
                    f"{token.token_key}  {token.user.get_username()}  "
                    f"created {token.created:%Y-%m-%dT%H:%MZ}  {expires}"
                )
            return
        user = self._user(username)
        if action == "revoke":
            count = api_token_revoke(user=user, token_key=options["key"])
            self.stdout.write(f"revoked {count} token(s) of {username}")
            return
        try:
            record, token = api_token_issue(user=user, ttl_days=options["ttl_days"])
        except OperatorActionError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(token)
        self.stderr.write(
            f"token {record.token_key}… for {username}, expires {record.expiry:%Y-%m-%dT%H:%MZ}; "
            "send it as `Authorization: Token <token>`. It is not shown again."
        )
