"""Suite-wide: the suite runs on PostgreSQL only, and the report's header says which one.

`make test` gives it one: DATABASE_URL, else the one on 127.0.0.1:LOCAL_POSTGRES_PORT, else
an embedded one it starts there (scripts/localdb.py).
"""

import shutil
import tempfile
from pathlib import Path

import pytest
from django.conf import settings


def _database() -> str:
    database = settings.DATABASES["default"]
    return f"{database['ENGINE']} {database['HOST']}:{database['PORT']}/{database['NAME']}"


def pytest_report_header(config):
    return f"eventdrop: database {_database()}"


def pytest_sessionstart(session):
    if settings.DATABASES["default"]["ENGINE"] != "kernel.db.postgresql":
        raise pytest.UsageError(
            f"the suite runs on PostgreSQL only, not {_database()}: unset DATABASE_URL (make "
            "test then finds or starts one) or point it at a PostgreSQL database"
        )


@pytest.fixture
def reachable_tmp_path():
    """A temp dir other users can reach, unlike pytest's tmp_path (under a 0700 dir): as
    root, a checkout's embedded PostgreSQL runs as its own user (scripts/localdb.py)."""
    path = Path(tempfile.mkdtemp(prefix="eventdrop_"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
