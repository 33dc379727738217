"""Create or update the database role of every process kind, with exactly its GRANTs.

    manage.py db_roles --dry-run     # print the SQL (passwords masked)
    manage.py db_roles               # apply it, in one transaction

Run it as the owner of the tables, after every `migrate`. Passwords (for managed
PostgreSQL) come from DATABASE_ROLE_PASSWORD_<KIND> (WEB, INBOX, DISPATCHER, WORKER,
CONSOLE); a role without one keeps its password. The kinds and their grants:
kernel/db_roles.py and docs/security.md.
"""

import os

from django.core.management.base import BaseCommand

from kernel.db_roles import ROLES, db_roles_apply, db_roles_dry_run, role_name


class Command(BaseCommand):
    help = "Create or update one PostgreSQL role per process kind, with exactly its GRANTs."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="print the SQL, change nothing")

    def handle(self, *args, dry_run: bool, **options):
        passwords = {
            spec.kind: os.environ[f"DATABASE_ROLE_PASSWORD_{spec.kind.upper()}"]
            for spec in ROLES
            if os.environ.get(f"DATABASE_ROLE_PASSWORD_{spec.kind.upper()}")
        }
        if dry_run:
            for statement in db_roles_dry_run(passwords=passwords).shown:
                self.stdout.write(statement + ";")
            return
        plan = db_roles_apply(passwords=passwords)
        roles = ", ".join(role_name(spec.kind) for spec in ROLES)
        self.stdout.write(f"db_roles: {roles} up to date ({len(plan.statements)} statements)")
