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


@pytest.mark.django_db
def test_the_processes_that_serve_pages_plan_with_the_values(client, admin_user):
    """A generic plan cannot use a partial index whose predicate names a parameter's value:
    after the prepare threshold, a list of pending events would scan the store
    (kernel/db/plans.py). The web process's connections plan every statement with its
    values."""
    from django.db.backends.signals import connection_created

    from kernel.db.plans import plan_with_values, serve_pages

    pending_sql = (
        "SELECT id FROM ingress_rawevent WHERE signature_status = $1 ORDER BY received_at LIMIT 1"
    )
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE pending_probe(text) AS {pending_sql}")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("EXPLAIN EXECUTE pending_probe('pending')")
        generic = "\n".join(row[0] for row in cursor.fetchall())
        plan_with_values(None, connection)
        cursor.execute("EXPLAIN EXECUTE pending_probe('pending')")
        custom = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone()[0] == "force_custom_plan"
        cursor.execute("DEALLOCATE pending_probe")
    # The generic plan knows no value: it scans and filters on $1; planned with the value,
    # the statement reads the pending rows' partial index, whose predicate it then implies.
    assert "Seq Scan" in generic and "$1" in generic
    assert "Index Scan" in custom and "$1" not in custom
    serve_pages()
    try:
        assert connection_created.has_listeners()
        with connection.cursor() as cursor:
            connection_created.send(sender=type(connection), connection=connection)
            cursor.execute("SHOW plan_cache_mode")
            assert cursor.fetchone()[0] == "force_custom_plan"
    finally:
        connection_created.disconnect(dispatch_uid="kernel.db.plans")
