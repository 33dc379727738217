"""Make or change a staff user of the console, by role.

    manage.py console_user ada --role viewer            # sees lists, pages, /ops/, /metrics
    manage.py console_user ada --role operator          # ... and replays, re-arms, pauses
    manage.py console_user ada --role payload-reader    # ... and sees bodies and headers
    manage.py console_user ada --role operator --password-env ADA_PASSWORD

Each role is a group of exactly its permissions (created or brought up to date on every run,
docs/console.md, "Who may do what"); the user is staff and in that group only of the three.
Without --password-env a new user has no usable password (an API token, `manage.py
api_token issue`, or a password set later with `manage.py changepassword`).
"""

import os

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.services import ROLES, OperatorActionError, staff_user_set_role


class Command(BaseCommand):
    help = "Make or change a console staff user by role: viewer, operator, payload-reader."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=sorted(ROLES))
        parser.add_argument(
            "--password-env", default="", help="the environment variable holding its password"
        )

    def handle(
        self, *args: object, username: str, role: str, password_env: str, **options: object
    ) -> None:
        password = None
        if password_env:
            password = os.environ.get(password_env)
            if not password:
                raise CommandError(f"{password_env} is not set.")
        try:
            user, created = staff_user_set_role(username=username, role=role, password=password)
        except OperatorActionError as exc:
            raise CommandError(str(exc)) from exc
        what = "made" if created else "changed"
        self.stdout.write(f"{what} {user.get_username()}: staff, {role} ({ROLES[role].group})")
