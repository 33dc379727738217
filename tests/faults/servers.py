"""Real PgBouncer and Redis servers for the scale tests, started and removed by the test.

Debian's `pgbouncer` and `redis-server` binaries, each on a free port on 127.0.0.1 with its
files in a temporary directory; stopped by the PID we started. PgBouncer refuses to run as
root, so as root it is started with `-u postgres` (its own switch).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import free_port
from tests.support.tools import tool


def _wait_listening(process: subprocess.Popen, port: int, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited: {log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{process.args!r} not listening on {port}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@dataclass
class PgBouncer:
    port: int
    process: subprocess.Popen
    log: Path

    def url(self, db: str, user: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{db}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def admin(self, command: str) -> str:
        """A command on PgBouncer's admin console (simple query protocol: psql)."""
        result = subprocess.run(
            [
                "psql",
                "-X",
                "-A",
                "-t",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                "pgbouncer",
                "-c",
                command,
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return result.stdout


@contextlib.contextmanager
def pgbouncer(
    backend_port: int, *, pool_size: int = 10, extra: str = "", timeout: float = 15
) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling mode in front of every database on `backend_port`.

    Its other settings are Debian's defaults; in particular `ignore_startup_parameters` is
    empty, so a client sending the libpq `options` startup setting is refused, as in a
    stock deployment (pgbouncer#381)."""
    binary = tool("pgbouncer")
    workdir = Path(tempfile.mkdtemp(prefix="ed_pgbouncer_"))
    port = free_port()
    (workdir / "userlist.txt").write_text('"postgres" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host=127.0.0.1 port={backend_port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {workdir / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        "max_client_conn = 1000\n"
        f"default_pool_size = {pool_size}\n"
        "max_db_connections = 0\n"
        "admin_users = postgres\n"
        f"{extra}\n"
    )
    # PgBouncer runs as postgres and must read its files (mkdtemp makes the dir 0700).
    os.chmod(workdir, 0o755)  # noqa: S103
    log = workdir / "pgbouncer.log"
    args = [binary, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:
        args[1:1] = ["-u", "postgres"]
    with log.open("ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        _wait_listening(process, port, log, timeout)
        yield PgBouncer(port, process, log)
    finally:
        _stop(process)
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Redis:
    port: int
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@contextlib.contextmanager
def redis_server(timeout: float = 15) -> Iterator[Redis]:
    """A redis-server of our own: no persistence (a lost message must lose no work, and the
    tests show it does not), loopback only."""
    binary = tool("redis-server")
    workdir = Path(tempfile.mkdtemp(prefix="ed_redis_"))
    port = free_port()
    log = workdir / "redis.log"
    args = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(workdir),
        "--protected-mode",
        "yes",
    ]
    with log.open("ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        _wait_listening(process, port, log, timeout)
        yield Redis(port, process)
    finally:
        _stop(process)
        shutil.rmtree(workdir, ignore_errors=True)
