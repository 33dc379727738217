"""Make the settings' statement_timeout the database's own default (ALTER DATABASE … SET).

Needed behind PgBouncer in transaction pooling mode (DATABASE_POOLER=pgbouncer), which
cannot carry the libpq `options` startup setting a direct connection sends: PostgreSQL
applies a database default at the start of every server session, so it holds for every
connection PgBouncer opens, whichever client it later serves, and nothing per transaction
is needed. On the database rather than on a role so that it covers every role the
processes log in as (`manage.py db_roles`) without naming them. Run it in the release
phase, as the database's owner (first when the release phase itself goes through PgBouncer;
it needs no tables); every connection through the pooler checks it
(kernel/db/postgresql/base.py) and is refused until it has run. A changed value applies
to server sessions opened after it: RECONNECT on PgBouncer's admin console, or wait for its
server_lifetime.
"""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections
from psycopg import sql

from kernel.db.postgresql.base import pooled_statement_timeout_ms


class Command(BaseCommand):
    help = "Set the settings' statement_timeout as the database's default (for PgBouncer)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(self, *args: Any, database: str, **options: Any) -> None:
        connection = connections[database]
        timeout_ms = pooled_statement_timeout_ms(connection.settings_dict["OPTIONS"]["options"])
        # Our own connection, not Django's: behind the pooler Django's refuses to open until
        # this default exists (the check in init_connection_state).
        raw = connection.get_new_connection(connection.get_connection_params())
        try:
            raw.autocommit = True
            name = raw.execute("SELECT current_database()").fetchone()[0]
            raw.execute(
                sql.SQL("ALTER DATABASE {} SET statement_timeout = {}").format(
                    sql.Identifier(name), sql.Literal(timeout_ms)
                )
            )
        finally:
            raw.close()
        self.stdout.write(
            f"database_timeouts: statement_timeout = {timeout_ms} ms is the default of "
            f"database {name} (new server sessions)"
        )
