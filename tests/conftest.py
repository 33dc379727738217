"""Suite-wide fixtures and the PostgreSQL guard.

`postgres`-marked tests are skipped, with the reason in the summary, when the suite runs on
SQLite. CI sets EVENTDROP_REQUIRE_POSTGRES=1 so a suite that silently fell back to SQLite
fails instead of passing with half its tests skipped.
"""

import os

import pytest
from django.conf import settings


def _vendor() -> str:
    engine = settings.DATABASES["default"]["ENGINE"]
    return "postgresql" if "postgresql" in engine else engine.rsplit(".", 1)[-1]


def pytest_report_header(config):
    return f"eventdrop: database vendor = {_vendor()}"


def pytest_sessionstart(session):
    if os.environ.get("EVENTDROP_REQUIRE_POSTGRES") == "1" and _vendor() != "postgresql":
        raise pytest.UsageError(
            "EVENTDROP_REQUIRE_POSTGRES=1 but the suite would run on "
            f"{_vendor()}; set DATABASE_URL to a PostgreSQL database."
        )


def pytest_collection_modifyitems(config, items):
    if _vendor() == "postgresql":
        return
    skip = pytest.mark.skip(
        reason="needs PostgreSQL (set DATABASE_URL or run one on 127.0.0.1:5432)"
    )
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)
