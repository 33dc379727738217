"""Create or update the database role of every process kind, with exactly its GRANTs.

    manage.py db_roles --dry-run          # print the SQL (passwords masked)
    manage.py db_roles                    # apply it, in one transaction
    manage.py db_roles --release          # the Procfile's release line: apply it when
                                          # DATABASE_ROLES_MANAGED is on, else say so

Run it as the owner of the tables, after every `migrate`. Passwords (for managed
PostgreSQL) come from DATABASE_ROLE_PASSWORD_<KIND> (WEB, INBOX, DISPATCHER, WORKER,
CONSOLE); a role without one keeps its password. The kinds and their grants:
kernel/db_roles.py and docs/security.md.
"""

import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from kernel.db_roles import ROLES, db_roles_apply, db_roles_dry_run, may_create_roles, role_name


class Command(BaseCommand):
    help = "Create or update one PostgreSQL role per process kind, with exactly its GRANTs."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="print the SQL, change nothing")
        parser.add_argument(
            "--release",
            action="store_true",
            help="the release phase: apply only when DATABASE_ROLES_MANAGED is on",
        )

    def handle(self, *args, dry_run: bool, release: bool, **options):
        if release and not settings.DATABASE_ROLES_MANAGED:
            self.stdout.write("db_roles: DATABASE_ROLES_MANAGED is off, roles left as they are")
            return
        if release and not may_create_roles():
            raise CommandError(
                "db_roles: this role may not create roles: run the release as the tables' "
                "owner with CREATEROLE, or turn DATABASE_ROLES_MANAGED off (docs/security.md)"
            )
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
