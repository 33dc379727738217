"""One helper for tests that query PostgreSQL with psycopg directly."""

from typing import Any

import psycopg


def scalar(conn: psycopg.Connection[Any], query: str) -> Any:
    """The first column of the one row `query` returns; no row fails the test, naming it."""
    row = conn.execute(query).fetchone()
    assert row is not None, f"no row: {query}"
    return row[0]


def database_dsn() -> str:
    """The test database as a psycopg connection string: a second connection, as another
    process (a worker's batch, an operator's transaction) would hold one."""
    from django.db import connection

    db = connection.settings_dict
    return (
        f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} "
        f"user={db['USER']} dbname={db['NAME']}"
    )
