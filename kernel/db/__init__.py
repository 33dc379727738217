"""Client-side bounds on every database wait (issue 8, findings 5 and 6).

`statement_timeout` is enforced by the server: a server that is frozen (SIGSTOP, a stalled
disk, a hung VM) enforces nothing, while its kernel still ACKs our packets and keepalives.
So every wait for PostgreSQL also has a bound on our side:

- `kernel.db.postgresql` (the ENGINE on PostgreSQL) opens `BoundedConnection`s: psycopg's
  one wait loop gets a timeout, so no query, commit or rollback waits longer than the
  connection's `client_wait_timeout` (statement_timeout + a margin, in OPTIONS), and never
  past a deadline set with `database_deadline()` in the same thread/context.
- `database_deadline(seconds)` scopes a tighter bound around one operation (the webhook
  INSERT, ingress/services.py). A connection opened inside it gets a connect timeout that
  fits what is left.
- Django's per-request health check is a poll(2) of the idle socket, not a `SELECT 1`: a
  connection the server hung up on (restart, terminate) is dropped before it is used, at no
  round trip.
"""

from psycopg import sql

from kernel.db.bounds import database_deadline, deadline_seconds_left

__all__ = ["database_deadline", "deadline_seconds_left", "sql_literal"]


def sql_literal(value: str) -> str:
    """`value` as an SQL string literal, for DDL and DO blocks, which take no parameters."""
    return sql.Literal(value).as_string(None)
