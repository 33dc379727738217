"""One helper for tests that query PostgreSQL with psycopg directly."""

from typing import Any

import psycopg


def scalar(conn: psycopg.Connection[Any], query: str) -> Any:
    """The first column of the one row `query` returns; no row fails the test, naming it."""
    row = conn.execute(query).fetchone()
    assert row is not None, f"no row: {query}"
    return row[0]
