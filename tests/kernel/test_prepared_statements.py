"""Statements prepared on the server (DATABASE_PREPARE_THRESHOLD, eventdrop/settings.py): on a
direct connection the values are bound on the server and a statement run again is parsed
and planned once per connection; behind PgBouncer, or with the threshold at 0, the client
binds as Django does by default."""

import asyncio
import json
import os
import subprocess

import pytest
from django.db import connection

from ingress.models import RawEvent, SignatureStatus
from kernel.db.postgresql.base import open_async_connection
from tests.support.processes import PYTHON, ROOT, app_env

_SERVER_PREPARED = "SELECT count(*) FROM pg_prepared_statements WHERE NOT from_sql"


def _options(**environ: str) -> dict:
    """OPTIONS of the default database as a fresh process with `environ` builds them."""
    database_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/x")
    out = subprocess.run(
        [
            PYTHON,
            "-c",
            "import json, django; django.setup(); from django.conf import settings; "
            "print(json.dumps(settings.DATABASES['default']['OPTIONS'], default=str))",
        ],
        cwd=ROOT,
        env=app_env(database_url, **environ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_a_direct_connection_binds_on_the_server_and_prepares():
    options = _options()
    assert options["server_side_binding"] is True
    assert options["prepare_threshold"] == 5


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_behind_pgbouncer_the_client_binds():
    # PgBouncer 1.18 hands the server session to another client after each transaction: a
    # statement prepared in one would be missing, or someone else's, in the next.
    options = _options(DATABASE_POOLER="pgbouncer")
    assert "server_side_binding" not in options
    assert "prepare_threshold" not in options


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_a_threshold_of_zero_binds_on_the_client():
    options = _options(DATABASE_PREPARE_THRESHOLD="0")
    assert "server_side_binding" not in options
    assert "prepare_threshold" not in options


@pytest.mark.django_db
def test_an_orm_statement_run_again_is_prepared_once_and_answers_the_same():
    RawEvent.objects.filter(pk=0).exists()  # connect
    with connection.cursor() as cursor:
        cursor.execute(_SERVER_PREPARED)
        (before,) = cursor.fetchone()
    # The same statement with other values each time, as a worker runs it per event.
    answers = [
        RawEvent.objects.filter(pk=number, signature_status=SignatureStatus.PENDING).count()
        for number in range(8)
    ]
    with connection.cursor() as cursor:
        cursor.execute(_SERVER_PREPARED)
        (after,) = cursor.fetchone()

    assert answers == [0] * 8
    assert after > before


@pytest.mark.django_db(transaction=True)
def test_the_web_servers_asyncio_connection_prepares_too():
    # The loop's group commit opens its connection with the backend's own parameters
    # (open_async_connection): its INSERT, the same text batch after batch, is prepared.
    async def prepared_after_repeats() -> tuple[int, int]:
        held = await open_async_connection("default")
        try:
            counts = []
            for _ in range(2):
                cursor = await held.execute(_SERVER_PREPARED)
                (count,) = await cursor.fetchone()  # type: ignore[misc]
                counts.append(count)
                for number in range(6):
                    await held.execute("SELECT %s::int + 1", [number])
            return counts[0], counts[1]
        finally:
            await held.close()

    before, after = asyncio.run(prepared_after_repeats())
    assert after > before
