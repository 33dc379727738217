"""The first hour, as a newcomer has it: a fresh clone, `make run`, and a second shell.

From a `git clone` of HEAD (what is not committed is not there), with a clean environment
(no DJANGO_*, no DATABASE_URL, and the `.env` that the first run writes): `make run` — the
clone links this checkout's virtualenv, and make is told not to reinstall it — on free ports,
with LOCAL_POSTGRES_PORT on a free port too, so that no PostgreSQL answers there and
`make run` starts the embedded one. Then, from "another shell" (a process with only PATH and
HOME): the landing page, `manage.py check`, `process_inbox --once`, a staff user signed in
to the console, the Stripe handler paused on the console's pause page, `manage.py demo`
whose paid recap's delivery the pause holds, the resume on that page releasing it, both
recaps ready, `handled_at` on every dispatched raw event, the ops page green, and the
README's curl. Ctrl-C (SIGINT to the process group) then stops everything, the embedded
PostgreSQL included. Every step is bounded; everything started is stopped by PID.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.support.processes import ROOT, VENV_BIN, free_port, listening
from tests.support.tools import tool

pytestmark = pytest.mark.slow

BUDGET_SECONDS = 180
PASSWORD = "a-long-first-run-password"
HANDLER = "recaps.handlers.record_checkout_session"  # the Stripe payment handler
# Until every dispatched raw event is handled: a JSON list of (id, source, handled_at).
HANDLED = """
import json, time
from ingress.models import RawEvent
deadline = time.monotonic() + 30
while True:
    rows = list(RawEvent.objects.filter(dispatch_status="dispatched")
                .order_by("id").values_list("id", "source", "handled_at"))
    if (rows and all(row[2] for row in rows)) or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(json.dumps([[i, source, handled and handled.isoformat()] for i, source, handled in rows]))
"""


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """A new (root) shell's environment: nothing of this test process (test settings)."""
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
    }
    env.update(extra)
    return env


def runs_in(pid: int, directory: Path) -> bool:
    """Whether `pid` is one of ours: alive and working in the clone (a directory of this
    test's own) or below it, as every process of make run does, the embedded PostgreSQL
    too."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cwd = Path(f"/proc/{pid}/cwd").resolve()
    except OSError:
        return False
    return state != "Z" and cwd.is_relative_to(directory.resolve())


def readme_curl() -> str:
    """The README's signed GitHub example, exactly as a reader would paste it."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", readme, flags=re.S)
    (block,) = [b for b in blocks if "/webhooks/github/" in b and "openssl dgst" in b]
    return block


@pytest.fixture
def fresh_clone(reachable_tmp_path):
    for name in ("git", "make", "curl", "openssl"):
        tool(name)
    clone = reachable_tmp_path / "eventdrop"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=60)
    (clone / ".venv").symlink_to(VENV_BIN.parent)  # the suite's own virtualenv
    home = reachable_tmp_path / "home"
    home.mkdir()
    return clone, home


def make_run(clone: Path, home: Path, log: Path, **env: str) -> subprocess.Popen:
    """`make run` in its own process group (a terminal's foreground job); its virtualenv
    (this checkout's) counts as installed."""
    with log.open("wb") as out:
        return subprocess.Popen(
            ["make", "--no-print-directory", "-o", ".venv/.installed", "run"],
            cwd=clone,
            env=clean_env(home, **env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def make_run_on_free_ports(
    clone: Path, home: Path, log: Path, **env: str
) -> tuple[subprocess.Popen, int]:
    """`make run` with every port free (the embedded PostgreSQL's too); and its web port."""
    port = free_port()
    run = make_run(
        clone,
        home,
        log,
        PORT=str(port),
        FAKE_RENDERER_PORT=str(free_port()),
        FAKE_STRIPE_PORT=str(free_port()),
        LOCAL_POSTGRES_PORT=str(free_port()),
        **env,
    )
    return run, port


def landing(run: subprocess.Popen, port: int, log: Path, timeout: float = 120) -> None:
    """Until the landing page answers 200, `make run` still running."""
    deadline = time.monotonic() + timeout
    while True:
        assert run.poll() is None, f"make run exited {run.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no landing page in {timeout} s:\n{log.read_text()}"
        try:
            if requests.get(f"http://127.0.0.1:{port}/", timeout=(1, 5)).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)


# Each process's own shutdown takes about a second; granian's kill of a worker that will not
# stop takes 30 (eventdrop/web.py), which a worker restarting on every reload met (a minute).
CTRL_C_SECONDS = 20


def ctrl_c(run: subprocess.Popen, clone: Path) -> list[int]:
    """Ctrl-C to `make run`'s process group, as a terminal sends it; then whatever of ours
    still runs CTRL_C_SECONDS later is killed, and returned."""
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.wait(timeout=CTRL_C_SECONDS)
    # Ours: every process working in the clone, the embedded PostgreSQL included (its data
    # directory is there), also one that left make run's tree or started after Ctrl-C.
    running = {int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()}
    survivors = [pid for pid in running if runs_in(pid, clone)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    run.wait(timeout=10)
    return survivors


def test_first_run_from_a_fresh_clone(fresh_clone, tmp_path):
    clone, home = fresh_clone
    deadline = time.monotonic() + BUDGET_SECONDS
    port, renderer_port, stripe_port = free_port(), free_port(), free_port()
    pg_port = free_port()  # nothing answers there: make run starts the embedded PostgreSQL
    log_path = tmp_path / "make-run.log"
    run = make_run(
        clone,
        home,
        log_path,
        PORT=str(port),
        FAKE_RENDERER_PORT=str(renderer_port),
        FAKE_STRIPE_PORT=str(stripe_port),
        LOCAL_POSTGRES_PORT=str(pg_port),
    )
    survivors: list[int] = []

    def left(limit: float) -> float:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"over the {BUDGET_SECONDS} s budget:\n{log_path.read_text()}"
        return min(limit, remaining)

    def second_shell(*args: str, limit: float = 30, **env: str) -> subprocess.CompletedProcess:
        # No ports, no secrets: all of that must come from the .env the first run wrote.
        result = subprocess.run(
            [".venv/bin/python", "manage.py", *args],
            cwd=clone,
            env=clean_env(home, **env),
            capture_output=True,
            text=True,
            timeout=left(limit),
            check=False,
        )
        assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
        return result

    try:
        # 1. The landing page answers (plain, not signed in), on the embedded PostgreSQL.
        landing = None
        while landing is None:
            assert run.poll() is None, f"make run exited {run.returncode}:\n{log_path.read_text()}"
            left(120)
            try:
                landing = requests.get(f"http://127.0.0.1:{port}/", timeout=(1, 5))
            except requests.ConnectionError:
                time.sleep(0.2)
        assert landing.status_code == 200 and "EventDrop" in landing.text
        (database_line,) = [
            line for line in log_path.read_text().splitlines() if line.startswith("database: ")
        ]
        assert f"on 127.0.0.1:{pg_port}, database eventdrop (embedded, data in .pgdata/" in (
            database_line
        )
        env_file = (clone / ".env").read_text()
        assert f"PORT={port}\n" in env_file and "DJANGO_SECRET_KEY=" in env_file
        assert f"LOCAL_POSTGRES_PORT={pg_port}\n" in env_file  # what another shell needs
        assert not subprocess.run(
            ["git", "status", "--porcelain"],
            cwd=clone,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip(), ".env and .pgdata/ must be ignored by git"

        # 2. Commands from another shell reach the same database.
        assert "System check identified no issues" in second_shell("check").stdout
        assert second_shell("process_inbox", "--once").stdout.startswith("verified ")
        second_shell(
            "createsuperuser",
            "--noinput",
            "--username",
            "oncall",
            "--email",
            "oncall@localhost",
            DJANGO_SUPERUSER_PASSWORD=PASSWORD,
        )
        console = signed_in(f"http://127.0.0.1:{port}", timeout=left(10))

        # 3. The Stripe handler paused on the console's pause page.
        pauses = console.get(f"http://127.0.0.1:{port}/ops/pauses/", timeout=left(10))
        assert f'data-handler="{HANDLER}"' in pauses.text
        paused = post_form(
            console,
            f"http://127.0.0.1:{port}/ops/pauses/pause/",
            {"handler": HANDLER, "reason": "first run: hold the demo's payment"},
            timeout=left(10),
        )
        assert f"Paused handler {HANDLER}: 0 deliveries held" in paused.text, paused.text

        # 4. The demo: its paid recap's payment webhook is stored, verified, and held.
        demo = subprocess.Popen(
            [".venv/bin/python", "manage.py", "demo", "--wait", "90"],
            cwd=clone,
            env=clean_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            while held(console, port, timeout=left(10)) < 1:
                assert demo.poll() is None, f"demo exited {demo.returncode}: {demo.stdout}"
                time.sleep(0.5)

            # 5. Resumed on the same page: the held delivery is released and runs.
            resumed = post_form(
                console,
                f"http://127.0.0.1:{port}/ops/pauses/resume/",
                {"handler": HANDLER},
                timeout=left(10),
            )
            assert f"Resumed handler {HANDLER}: 1 deliveries released" in resumed.text, resumed.text
            assert 'id="pauses-none"' in resumed.text
            output, _ = demo.communicate(timeout=left(100))
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait(timeout=10)
        assert demo.returncode == 0, output + log_path.read_text()[-3000:]
        assert "free recap ready: https://" in output
        assert "paid recap ready: https://" in output
        assert "got HTTP 202 from our ingress" in output

        # 6. Every dispatched raw event handled (the payment and the render callbacks).
        shell = second_shell("shell", "-c", HANDLED, limit=45)
        rows = json.loads(shell.stdout.strip().splitlines()[-1])  # after Django's own line
        assert {source for _, source, _ in rows} >= {"stripe", "renderer"}, rows
        assert all(handled_at for _, _, handled_at in rows), rows

        # 7. The ops page: every figure green. The ACK p99 is how fast this machine answered
        # (a cold server beside a loaded suite passes 250 ms), so it is only shown, and the
        # overall level, the worst figure's, is green unless the ACK p99 alone is not.
        ops = console.get(f"http://127.0.0.1:{port}/ops/", timeout=left(10))
        assert ops.status_code == 200
        levels = dict(re.findall(r'<tr id="slo-(\w+)" data-level="(\w+)"', ops.text))
        assert "ack_p99" in levels, levels
        assert {key for key, level in levels.items() if level != "green"} <= {"ack_p99"}, levels
        if levels["ack_p99"] == "green":
            assert re.search(
                r'id="ops-overall">Overall: <span class="ops-level ops-level-green"', ops.text
            ), levels
        others = re.sub(r'<tr id="slo-ack_p99" data-level="\w+"', "", ops.text)
        assert not re.findall(r'data-level="(?:yellow|red)"', others)

        # 8. The README's curl, pasted into a shell where PORT is this run's.
        curl = subprocess.run(
            ["bash", "-c", readme_curl()],
            cwd=clone,
            env=clean_env(home, PORT=str(port)),
            capture_output=True,
            text=True,
            timeout=left(15),
            check=False,
        )
        assert "HTTP/1.1 202" in curl.stdout, curl.stdout + curl.stderr
        assert '"status": "accepted"' in curl.stdout

        # The run printed each system-check warning at most once, and reloaded nothing: no
        # source changed (the database's own writes under .pgdata/ are not a change).
        warnings = re.findall(r"\((\w+\.W\d+)\)", log_path.read_text())
        assert len(warnings) == len(set(warnings)), warnings
        assert "Changes detected" not in log_path.read_text()
    finally:
        survivors = ctrl_c(run, clone)
    assert not survivors, f"still running after Ctrl-C:\n{log_path.read_text()[-3000:]}"
    assert not (clone / ".pgdata" / "data" / "postmaster.pid").exists()
    for freed in (port, renderer_port, stripe_port, pg_port):  # nothing listens any more
        assert not listening(freed), freed


def signed_in(base: str, timeout: float) -> requests.Session:
    """A console session of the superuser, signed in through the admin's login form."""
    session = requests.Session()
    page = session.get(f"{base}/admin/login/", timeout=timeout)
    response = post_form(
        session,
        f"{base}/admin/login/?next=/admin/",
        {"username": "oncall", "password": PASSWORD},
        timeout=timeout,
        page=page.text,
    )
    assert "Log out" in response.text or "logout" in response.text, response.text[-2000:]
    return session


def post_form(
    session: requests.Session,
    url: str,
    data: dict[str, str],
    timeout: float,
    page: str | None = None,
) -> requests.Response:
    """A form post as the browser sends it: the CSRF token of the page, redirects followed."""
    if page is None:
        page = session.get(url.rsplit("/", 2)[0] + "/", timeout=timeout).text
    token = re.findall(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[0]
    response = session.post(
        url,
        data={"csrfmiddlewaretoken": token, **data},
        timeout=timeout,
        headers={"Referer": url},
    )
    assert response.status_code == 200, (response.status_code, response.text[-2000:])
    return response


def held(session: requests.Session, port: int, timeout: float) -> int:
    """Deliveries the pause holds, as the pauses page shows them."""
    page = session.get(f"http://127.0.0.1:{port}/ops/pauses/", timeout=timeout).text
    row = re.search(r'<tr id="pause-\d+".*?</tr>', page, flags=re.S)
    assert row, page[-2000:]
    return int(re.findall(r'<td class="num">(?:<a [^>]*>)?(\d+)(?:</a>)?</td>', row.group(0))[-1])


def test_make_run_prints_each_check_warning_once(fresh_clone, tmp_path):
    """A configuration with a warning (no STRIPE_API_KEY: an empty variable in the shell wins
    over .env) shows it once, from the one `manage.py check`, not once per process."""
    clone, home = fresh_clone
    log_path = tmp_path / "make-run.log"
    run, port = make_run_on_free_ports(clone, home, log_path, STRIPE_API_KEY="")
    try:
        landing(run, port, log_path)
        time.sleep(2)  # the workers that start beside the web server have checked by now
    finally:
        survivors = ctrl_c(run, clone)
    assert not survivors
    output = log_path.read_text()
    assert output.count("(recaps.W001)") == 1, output


def test_make_run_reloads_the_web_server_on_a_code_change(fresh_clone, tmp_path):
    """An edited Python file restarts the web server's worker, which answers again; the
    embedded PostgreSQL's writes under the checkout restart nothing. A second save while the
    new worker starts (granian's worker misses that stop) delays neither it nor Ctrl-C."""
    clone, home = fresh_clone
    log_path = tmp_path / "make-run.log"
    run, port = make_run_on_free_ports(clone, home, log_path)
    edited = clone / "eventdrop" / "urls.py"
    try:
        landing(run, port, log_path)
        assert "Changes detected" not in log_path.read_text()
        # Saved each second until the reloader, which starts watching after the worker, sees
        # it; then once more at once, while the new worker starts.
        deadline = time.monotonic() + 30
        saves: list[float] = []
        while f"Modified: {edited}" not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()
            if not saves or time.monotonic() - saves[-1] > 1:
                save(edited)
                saves.append(time.monotonic())
            time.sleep(0.05)
        seen = log_path.read_text().count(f"Modified: {edited}")
        save(edited)
        while log_path.read_text().count(f"Modified: {edited}") <= seen:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        landing(run, port, log_path)
    finally:
        survivors = ctrl_c(run, clone)
    assert not survivors, f"still running after Ctrl-C:\n{log_path.read_text()[-3000:]}"
    modified = re.findall(r"Modified: (.*)", log_path.read_text())
    assert set(modified) == {str(edited)}, modified


def save(path: Path) -> None:
    with path.open("a") as source:
        source.write("# edited\n")
