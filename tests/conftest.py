"""Suite-wide: the suite runs on PostgreSQL only, and the report's header says which one.

`make test` gives it one: DATABASE_URL, else the one on 127.0.0.1:LOCAL_POSTGRES_PORT, else
an embedded one it starts there (scripts/localdb.py).

The tiers (docs/development.md, "The tiers"): a test that starts a process (a server, a
command, a cluster, a browser) carries one of REAL_PROCESS_MARKERS, and `make check` runs
the others; an unmarked test that starts one fails, naming the marker it needs.
"""

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

REAL_PROCESS_MARKERS = ("faults", "slow", "browser")
# The modules of real-process tests that take longest (`make test PYTEST_ARGS=--durations=80`
# on 2026-12-06, 240 to 90 s each), started first: a long module started last is the tail
# of the whole run.
LONGEST_MODULES = (
    "tests.regions.test_rejoin",
    "tests.regions.test_multi_region",
    "tests.test_first_run",
    "tests.ingress.test_deliveries_finality",
    "tests.ingress.test_fair_share_processes",
    "tests.ingress.test_inbox_worker_deaths",
    "tests.faults.test_topology",
    "tests.ingress.test_claims_of_the_dead",
    "tests.regions.test_takeover_claims",
)


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


def _real_processes(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in REAL_PROCESS_MARKERS)


def pytest_collection_modifyitems(config, items):
    """Real-process tests first, the longest modules and then the longest kind first (xdist
    hands tests out in this order, so the long ones do not start last), each module's on one
    worker: they share the module's servers and clusters, built once. A module whose tests
    share nothing (SPREAD_ACROSS_WORKERS) and the in-process tests are spread one by one."""

    def tier(item: pytest.Item) -> tuple[int, int]:
        module = getattr(getattr(item, "module", None), "__name__", "")
        longest = LONGEST_MODULES.index(module) if module in LONGEST_MODULES else len(
            LONGEST_MODULES
        )
        kind = next(
            (n for n, name in enumerate(REAL_PROCESS_MARKERS) if item.get_closest_marker(name)),
            len(REAL_PROCESS_MARKERS),
        )
        return (longest, kind)

    items.sort(key=tier)  # stable: each tier keeps the collection order
    for item in items:
        if _real_processes(item) and not getattr(item.module, "SPREAD_ACROSS_WORKERS", False):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture(autouse=True)
def _in_process_only(request, monkeypatch):
    """An unmarked test runs in this process only (its threads included): `make check` runs
    it, so it must not start a server, a command or a browser."""
    if _real_processes(request.node):
        return
    name = request.node.nodeid

    def refuse(self, *args, **kwargs):
        raise RuntimeError(
            f"{name} starts a process: mark it with one of {', '.join(REAL_PROCESS_MARKERS)} "
            "(tests/conftest.py, docs/development.md 'The tiers')"
        )

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
