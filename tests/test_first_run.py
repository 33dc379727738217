"""The first hour, as a newcomer has it: a fresh clone, `make run`, and a second shell.

From a `git clone` of HEAD in a temp dir (what is not committed is not there), with a clean
environment (no DJANGO_*, no DATABASE_URL: SQLite, and the `.env` that the first run writes):
scripts/run-local.sh — what `make run` runs once its virtualenv is installed; the clone links
this checkout's .venv instead of installing one — on free ports; then, from "another shell"
(a process with only PATH and HOME), the landing page, `manage.py check`,
`process_inbox --once`, `manage.py demo` to a ready free and paid recap, and the README's own
curl, port adjusted. Every step is bounded; the whole test stays under 90 s (about 14 s on
2 cores). Everything it started is stopped by PID, survivors killed.
"""

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.support.processes import ROOT, VENV_BIN, free_port

pytestmark = pytest.mark.slow

BUDGET_SECONDS = 90


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A new shell's environment: nothing of this test process (which sets test settings)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (from /proc), to stop stragglers by PID."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def readme_curl() -> str:
    """The README's signed GitHub example, exactly as a reader would paste it."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", readme, flags=re.S)
    (block,) = [b for b in blocks if "/webhooks/github/" in b and "openssl dgst" in b]
    return block


@pytest.fixture
def fresh_clone(tmp_path):
    clone = tmp_path / "eventdrop"
    subprocess.run(
        ["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=60
    )
    (clone / ".venv").symlink_to(VENV_BIN.parent)  # the suite's own virtualenv
    home = tmp_path / "home"
    home.mkdir()
    return clone, home


def test_first_run_from_a_fresh_clone(fresh_clone, tmp_path):
    clone, home = fresh_clone
    started = time.monotonic()
    deadline = started + BUDGET_SECONDS
    port, renderer_port, stripe_port = free_port(), free_port(), free_port()
    log_path = tmp_path / "make-run.log"
    log = open(log_path, "wb")  # noqa: SIM115 (closed below)
    run = subprocess.Popen(
        ["bash", "scripts/run-local.sh"],
        cwd=clone,
        env=clean_env(
            home,
            PORT=str(port),
            FAKE_RENDERER_PORT=str(renderer_port),
            FAKE_STRIPE_PORT=str(stripe_port),
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    started_pids: set[int] = set()

    def left(limit: float) -> float:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"over the {BUDGET_SECONDS} s budget:\n{log_path.read_text()}"
        return min(limit, remaining)

    def second_shell(*args: str, limit: float = 30) -> subprocess.CompletedProcess:
        # No ports, no secrets: all of that must come from the .env the first run wrote.
        return subprocess.run(
            [".venv/bin/python", "manage.py", *args],
            cwd=clone, env=clean_env(home), capture_output=True, text=True,
            timeout=left(limit), check=False,
        )

    try:
        # 1. The landing page answers (plain, not signed in).
        landing = None
        while landing is None:
            assert run.poll() is None, f"make run exited {run.returncode}:\n{log_path.read_text()}"
            left(60)
            try:
                landing = requests.get(f"http://127.0.0.1:{port}/", timeout=(1, 5))
            except requests.ConnectionError:
                time.sleep(0.2)
        assert landing.status_code == 200 and "EventDrop" in landing.text
        started_pids = descendants(run.pid)
        env_file = (clone / ".env").read_text()
        assert f"PORT={port}" in env_file and "DJANGO_SECRET_KEY=" in env_file
        assert not subprocess.run(
            ["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True,
            check=True,
        ).stdout.strip(), ".env and the database must be ignored by git"

        # 2. Commands from another shell.
        check = second_shell("check")
        assert check.returncode == 0, check.stdout + check.stderr
        assert "System check identified no issues" in check.stdout
        inbox = second_shell("process_inbox", "--once")
        assert inbox.returncode == 0, inbox.stdout + inbox.stderr
        assert inbox.stdout.startswith("verified ")

        # 3. The demo takes a free and a paid recap (fake Stripe, signed webhook) to ready.
        demo = second_shell("demo", "--wait", "40", limit=50)
        assert demo.returncode == 0, demo.stdout + demo.stderr + log_path.read_text()[-3000:]
        assert "free recap ready: https://" in demo.stdout
        assert "paid recap ready: https://" in demo.stdout
        assert "got HTTP 202 from our ingress" in demo.stdout

        # 4. The README's curl, pasted into a shell (only the port differs).
        curl = subprocess.run(
            ["bash", "-c", readme_curl().replace("127.0.0.1:8000", f"127.0.0.1:{port}")],
            cwd=clone, env=clean_env(home), capture_output=True, text=True,
            timeout=left(15), check=False,
        )
        assert "HTTP/1.1 202" in curl.stdout, curl.stdout + curl.stderr
        assert '"status": "accepted"' in curl.stdout

        # The run printed each system-check warning at most once (recaps.W001 was seven).
        output = log_path.read_text()
        warnings = re.findall(r"\((\w+\.W\d+)\)", output)
        assert len(warnings) == len(set(warnings)), warnings
    finally:
        started_pids |= descendants(run.pid)
        if run.poll() is None:
            os.kill(run.pid, signal.SIGTERM)  # its trap stops every process it started
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.wait(timeout=20)
        survivors = [pid for pid in started_pids | {run.pid} if runs_in(pid, clone)]
        for pid in survivors:
            os.kill(pid, signal.SIGKILL)
        run.wait(timeout=10)
        log.close()
    assert not survivors, f"still running after make run stopped: {survivors}"
    for freed in (port, renderer_port, stripe_port):  # a clean stop: every port free again
        with socket.socket() as probe:
            # As a server binds: connections in TIME_WAIT do not hold a port.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", freed))


def runs_in(pid: int, directory: Path) -> bool:
    """Whether `pid` is still one of ours (alive, working in the clone): never kill a
    process that merely reused a number."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z" and Path(f"/proc/{pid}/cwd").resolve() == directory.resolve()
    except OSError:
        return False


def test_make_run_prints_each_check_warning_once(fresh_clone, tmp_path):
    """A configuration with a warning (no STRIPE_API_KEY: an empty variable in the shell wins
    over .env) shows it once, from the one `manage.py check`, not once per process."""
    clone, home = fresh_clone
    port = free_port()
    log_path = tmp_path / "make-run.log"
    with open(log_path, "wb") as log:
        run = subprocess.Popen(
            ["bash", "scripts/run-local.sh"],
            cwd=clone,
            env=clean_env(
                home,
                PORT=str(port),
                FAKE_RENDERER_PORT=str(free_port()),
                FAKE_STRIPE_PORT=str(free_port()),
                STRIPE_API_KEY="",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        pids: set[int] = set()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and run.poll() is None:
                try:
                    requests.get(f"http://127.0.0.1:{port}/", timeout=(1, 5))
                    break
                except requests.ConnectionError:
                    time.sleep(0.2)
            time.sleep(2)  # the workers that start beside the web server have checked by now
            pids = descendants(run.pid)
        finally:
            pids |= descendants(run.pid)
            if run.poll() is None:
                os.kill(run.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.wait(timeout=20)
            for pid in [pid for pid in pids | {run.pid} if runs_in(pid, clone)]:
                os.kill(pid, signal.SIGKILL)
            run.wait(timeout=10)
    output = log_path.read_text()
    assert output.count("(recaps.W001)") == 1, output
