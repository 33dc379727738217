"""A throw-away PostgreSQL cluster for tests that crash, restart or freeze the database.

The shared server on 127.0.0.1:5432 is never touched: each `throwaway_cluster()` creates
its own cluster with Debian's `pg_createcluster` on a free port (trust auth, loopback only),
starts it, and drops it on exit — also when the test failed, and after thawing it first if
the test left it frozen. Clusters left behind by a killed run carry the prefix and a
timestamp in their name, so `pg_lsclusters` shows where they came from.

    with throwaway_cluster() as cluster:
        cluster.createdb("eventdrop")
        url = cluster.url("eventdrop")
        cluster.freeze(); ...; cluster.thaw()
        cluster.restart("immediate")   # a crash: no shutdown checkpoint

    with replica_of(cluster) as replica:   # a hot standby streaming from it
        replica.psql("SELECT pg_is_in_recovery()")  # 't'
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tests.support.tools import tool

VERSION = os.environ.get("EVENTDROP_PG_VERSION", "15")
_SETTINGS = (
    # Loopback only (the default 'localhost' also means ::1, which is loopback too).
    "listen_addresses = '127.0.0.1'",
    "max_connections = 200",
    # Small and quick to start; durability settings stay at their defaults on purpose:
    # the fault suite asserts that every 2xx survives a crash.
    "shared_buffers = '32MB'",
    "log_min_messages = warning",
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run(*args: str, timeout: float = 60) -> str:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        command = " ".join(args)
        raise RuntimeError(f"{command} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


class Cluster:
    def __init__(self, name: str, port: int, version: str = VERSION) -> None:
        self.name, self.port, self.version = name, port, version
        self.data_dir = Path(f"/var/lib/postgresql/{version}/{name}")
        self.config_dir = Path(f"/etc/postgresql/{version}/{name}")
        self._frozen: list[int] = []

    def url(self, db: str = "postgres", user: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{db}"

    # --- lifecycle ---------------------------------------------------------------------

    def create(self) -> None:
        # Missing, the test is skipped with the install line (failed on CI).
        tool("pg_createcluster")
        tool(f"/usr/lib/postgresql/{self.version}/bin/postgres")
        _run(
            "pg_createcluster", self.version, self.name, "-p", str(self.port), "--", "--auth=trust"
        )
        with (self.config_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# throw-away test cluster (tests/support/pg_cluster.py)\n")
            conf.write("\n".join(_SETTINGS) + "\n")

    def start(self, timeout: float = 30) -> None:
        _run("pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, "start")
        self.wait_ready(timeout)

    def stop(self, mode: str = "fast") -> None:
        """`fast` is a clean shutdown; `immediate` is a crash (recovery on next start)."""
        self.thaw()
        _run(
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            self.version,
            self.name,
            "stop",
            "-m",
            mode,
        )

    def restart(self, mode: str = "fast", timeout: float = 30) -> None:
        self.stop(mode)
        self.start(timeout)

    def drop(self) -> None:
        self.thaw()
        subprocess.run(
            ["pg_dropcluster", self.version, self.name, "--stop"],
            capture_output=True,
            timeout=60,
            check=False,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = subprocess.run(
                ["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                timeout=10,
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise TimeoutError(f"cluster {self.name} not ready on port {self.port} in {timeout}s")

    # --- faults ------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """The postmaster and every process it forked (backends included)."""
        pid_file = self.data_dir / "postmaster.pid"
        if not pid_file.exists():
            return []
        postmaster = int(pid_file.read_text().split()[0])
        children = subprocess.run(
            ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [postmaster, *map(int, children)]

    def freeze(self) -> None:
        """SIGSTOP every process of the cluster: the kernel still accepts and ACKs TCP,
        nothing answers — the fault that server-side timeouts cannot see. The postmaster
        stops first, then its children are listed: a backend it forked meanwhile is among
        them, never left running."""
        pids = self.pids()
        while pids:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    self._frozen.append(pid)
            pids = [pid for pid in self.pids() if pid not in self._frozen]

    def thaw(self) -> None:
        while self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._frozen.pop(), signal.SIGCONT)

    # --- SQL -----------------------------------------------------------------------------

    def psql(self, sql: str, db: str = "postgres", timeout: float = 30) -> str:
        return _run(
            "psql",
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            db,
            "-c",
            sql,
            timeout=timeout,
        ).strip()

    def createdb(self, name: str) -> str:
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextlib.contextmanager
def throwaway_cluster(prefix: str = "ed") -> Iterator[Cluster]:
    name = f"{prefix}_{time.strftime('%H%M%S')}_{uuid.uuid4().hex[:6]}"
    cluster = Cluster(name, _free_port())
    try:
        cluster.create()
        cluster.start()
        yield cluster
    finally:
        cluster.drop()


@contextlib.contextmanager
def replica_of(primary: Cluster, prefix: str = "edreplica") -> Iterator[Cluster]:
    """A streaming replica (hot standby) of `primary` on a free port, dropped at exit.

    `pg_basebackup -R` copies the primary's data directory and writes the standby signal and
    `primary_conninfo`; the cluster's configuration (port, settings) is its own, from
    pg_createcluster. The primary's trust authentication covers replication connections."""
    name = f"{prefix}_{time.strftime('%H%M%S')}_{uuid.uuid4().hex[:6]}"
    replica = Cluster(name, _free_port(), primary.version)
    try:
        replica.create()
        # Emptied, not removed: pg_basebackup fills an empty directory, and this one is
        # already the postgres user's, with the mode PostgreSQL wants.
        for entry in replica.data_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        backup = [
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-D",
            str(replica.data_dir),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        ]
        if os.geteuid() == 0:
            backup = ["runuser", "-u", "postgres", "--", *backup]
        _run(*backup, timeout=120)
        replica.start()
        yield replica
    finally:
        replica.drop()
