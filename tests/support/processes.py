"""The project's processes as real OS processes, for tests that run the production shape.

`start_procfile("web", env, port=…)` runs the Procfile's own `web:` line through bash (as a
Procfile runner would, so `$PORT` and the line's other variables expand), in its own
process group so that stopping it stops the server's workers too. Whatever server the
Procfile names is what the tests exercise; nothing here names one.

Every process is stopped by the PID we started (SIGTERM to its group, SIGKILL after a
grace period); `Managed` is also a context manager.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import psycopg

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
VENV_BIN = Path(PYTHON).parent

# The secrets the test settings use (eventdrop/settings_test.py), so events signed with
# tests/support/signing.py verify in a subprocess too.
TEST_SECRETS = {
    "DJANGO_SECRET_KEY": "test-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz",
    "STRIPE_WEBHOOK_SECRET": "whsec_test_stripe_secret",
    "GITHUB_WEBHOOK_SECRET": "It's a Secret to Everybody",
    "SLACK_SIGNING_SECRET": "8f742231b10e8888abcd99yyyzzz85a5",
    "RENDERER_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    # Production refuses to start a dispatcher (and `check` fails, outbox.E004) without these;
    # a test that dispatches passes its fake render service's URL in `extra`.
    "RENDER_SERVICE_URL": "http://127.0.0.1:9",
    "RENDER_CALLBACK_URL": "http://127.0.0.1:9/webhooks/renderer/",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def settings_database_url(name: str | None = None) -> str:
    """This run's database as a URL for a subprocess (or the database `name` on its server)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    host, port = db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    return f"postgres://{db['USER']}@{host}:{port}/{name or db['NAME']}"


def app_env(database_url: str, **extra: str) -> dict[str, str]:
    """A clean environment (nothing inherited but PATH, HOME and the locale) for a
    production-mode process against `database_url`."""
    env = {
        name: os.environ[name] for name in ("PATH", "HOME", "LANG", "LC_ALL") if name in os.environ
    }
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    env.update(TEST_SECRETS)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "eventdrop.settings",
            "DJANGO_DEBUG": "0",
            # A developer's .env must not fill in what a test left out on purpose.
            "PYTHON_DOTENV_DISABLED": "1",
            "DATABASE_URL": database_url,
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra)
    return env


def manage(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run one manage.py command to completion; raises with its output if it fails."""
    result = subprocess.run(
        [PYTHON, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        command = " ".join(args)
        raise RuntimeError(
            f"manage.py {command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def migrate(env: dict[str, str]) -> None:
    """The Procfile's release phase, minus the schedules: schema and partitions. The first
    database of the day (per PostgreSQL version) in a test process is migrated; each later
    one gets its dump, the same tables, rows and partitions, in a quarter of a second
    instead of seconds of CPU per throw-away cluster."""
    url = env["DATABASE_URL"]
    with psycopg.connect(url, connect_timeout=10) as connection:
        major = connection.info.server_version // 10000
    binaries = Path(f"/usr/lib/postgresql/{major}/bin")
    key = f"{major} {datetime.now(UTC).date()}"  # a new day's partitions: migrate again
    if key in _MIGRATED:
        restore = subprocess.run(
            [binaries / "psql", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction", url],
            input=_MIGRATED[key],
            capture_output=True,
            timeout=60,
            check=False,
        )
        if restore.returncode != 0:
            raise RuntimeError(f"restoring the migrated schema failed:\n{restore.stderr!r}")
        return
    manage("migrate", "--noinput", env=env)
    manage("raw_event_partitions", env=env)
    if (binaries / "pg_dump").exists():
        dump = subprocess.run(
            [binaries / "pg_dump", "--no-owner", "--no-privileges", url],
            capture_output=True,
            timeout=60,
            check=True,
        )
        _MIGRATED.clear()
        _MIGRATED[key] = dump.stdout


# The dump of the schema migrate() last made, by PostgreSQL major version and day.
_MIGRATED: dict[str, bytes] = {}


def procfile_command(kind: str) -> str:
    for line in (ROOT / "Procfile").read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and name.strip() == kind:
            return command.strip()
    raise KeyError(f"no {kind!r} line in the Procfile")


class Managed:
    """A process we started, in its own process group."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path | str | None = None):
        self.args = args
        self.log_path = Path(log) if log else None
        self._log: IO[bytes] | int = subprocess.DEVNULL
        if self.log_path:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return ""

    def wait_listening(self, port: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(
                    f"{self.args!r} exited {self.process.returncode} before listening:\n"
                    f"{self.output()[-3000:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{self.args!r} not listening on {port} within {timeout}s")

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop(self, grace: float = 10) -> int | None:
        """SIGTERM to the group, SIGKILL if it is still there after `grace` seconds."""
        if self.alive:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(timeout=10)
        self._signal_group(signal.SIGKILL)  # stragglers of the group, if any
        self._close_log()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the whole group at once (a crash, not a shutdown)."""
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def _close_log(self) -> None:
        if not isinstance(self._log, int):
            self._log.close()

    def __enter__(self) -> Managed:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_procfile(
    kind: str, env: dict[str, str], port: int | None = None, log: Path | str | None = None
) -> Managed:
    """The Procfile's `kind` line, run through bash with PORT set (when given)."""
    env = dict(env)
    if port is not None:
        env["PORT"] = str(port)
    return Managed(["bash", "-c", f"exec {procfile_command(kind)}"], env, log)


def start_manage(args: list[str], env: dict[str, str], log: Path | str | None = None) -> Managed:
    return Managed([PYTHON, "manage.py", *args], env, log)


def wait_until(
    condition: Callable[[], bool],
    what: str,
    saw: Callable[[], object],
    processes: Sequence[Managed],
    timeout: float = 120,
) -> None:
    """Until `condition` holds, the processes alive; on giving up, says what it waited for,
    what it saw and the processes' last words. For faults driven by progress, not time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            assert process.alive, f"{process.args} died:\n{process.output()[-3000:]}"
        if condition():
            return
        time.sleep(0.1)
    logs = "\n".join(process.output()[-1500:] for process in processes)
    raise AssertionError(f"timed out waiting for {what}; saw {saw()}\n{logs}")


class PeakRSS:
    """The largest resident set (bytes) each process of the tree under `root` had, sampled
    every `interval` seconds until the `with` block ends (Linux's /proc)."""

    def __init__(self, root: int, interval: float = 0.1):
        self.root, self.interval = root, interval
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @staticmethod
    def rss(pid: int) -> int | None:
        """One process's resident set now, or None once it is gone."""
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return None
        line = next((line for line in status.splitlines() if line.startswith("VmRSS:")), None)
        return int(line.split()[1]) * 1024 if line else None

    @classmethod
    def tree(cls, pid: int) -> list[int]:
        children: list[int] = []
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                children += map(int, (task / "children").read_text().split())
        except OSError:
            return [pid]
        return [pid, *(p for child in children for p in cls.tree(child))]

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for pid in self.tree(self.root):
                rss = self.rss(pid)
                if rss is not None and rss > self.peak.get(pid, 0):
                    self.peak[pid] = rss
