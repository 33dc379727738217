"""Rows for one set-based statement, sent to PostgreSQL as a single JSON document.

psycopg adapts a list parameter (an array for `unnest()`) element by element in Python: for
the inbox worker's batches of 500 events that was a seventh of its CPU, and for the web
server's batch of webhooks more than the rest of the INSERT (docs/benchmarks.md). The C JSON
encoder builds the whole document at once, and PostgreSQL's `json_to_recordset` /
`json_populate_recordset` give each value its column's type by that type's own input
function, exactly as a parameter of that type would (a value the column refuses fails the
statement the same way).
"""

import datetime
import json
from collections.abc import Iterable, Sequence
from typing import Any


def json_scalar(value: Any) -> str:
    """A value json.dumps has no form for, in the text form PostgreSQL's input function of
    its column reads."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            raise TypeError("a naive datetime has no instant to store")
        return value.isoformat()
    raise TypeError(f"no JSON form for {type(value).__name__}")


ENCODER = json.JSONEncoder(separators=(",", ":"), default=json_scalar)


def json_rows(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """The document `json_to_recordset(%s::json) AS v(<column> <type>, …)` reads: one object
    a row, keyed by column, in the rows' order (which the function keeps)."""
    return ENCODER.encode([dict(zip(columns, row, strict=True)) for row in rows])
