"""kernel/db/json_rows.py: a batch's rows as one JSON document that PostgreSQL's
json_to_recordset turns back into typed columns, exactly and in order."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection

from kernel.db.json_rows import json_rows

PLUS_FIVE = timezone(timedelta(hours=5))
ROWS = [
    (1, "caf\u00e9 \u2603 \"quoted\" \\ 'single'", datetime(2026, 12, 3, 12, 0, 0, 123456, UTC)),
    (9_007_199_254_740_993, None, datetime(2026, 12, 3, 13, 0, tzinfo=PLUS_FIVE)),
    (-7, "", None),
]


def test_a_naive_datetime_or_an_unknown_type_is_refused():
    with pytest.raises(TypeError, match="naive"):
        json_rows(["at"], [(datetime(2026, 12, 3, tzinfo=UTC).replace(tzinfo=None),)])
    with pytest.raises(TypeError, match="bytes"):
        json_rows(["body"], [(b"\x00",)])


@pytest.mark.django_db
def test_json_to_recordset_gives_back_every_value_typed_and_in_order():
    document = json_rows(["n", "text", "at"], ROWS)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n, text, at FROM json_to_recordset(%s::json)"
            " AS v(n bigint, text varchar(64), at timestamptz)",
            [document],
        )
        # Exact values (text, 64-bit ints, instants to the microsecond, NULLs), rows in order.
        assert [tuple(row) for row in cursor.fetchall()] == ROWS
