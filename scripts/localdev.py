"""`make run`'s preparations, before anything is started (scripts/run-local.sh).

    python scripts/localdev.py ports      # prints "PORT FAKE_RENDERER_PORT FAKE_STRIPE_PORT",
                                          # exit 1 with one line naming a port that is busy
    python scripts/localdev.py ensure-env # writes .env from .env.example on first use

Ports come from the real environment first, then `.env`, then `.env.example` (the same
order eventdrop/settings.py reads them in, through the same library), so the port checked
is the port the process will bind. Standard library and python-dotenv only: it runs before
Django is imported.
"""

import os
import secrets
import socket
import sys
from pathlib import Path

from dotenv import dotenv_values

ROOT = Path(__file__).resolve().parent.parent
ENV_FILE = ROOT / ".env"
EXAMPLE_FILE = ROOT / ".env.example"
SECRET_KEY_LINE = "DJANGO_SECRET_KEY="  # noqa: S105 (the line to fill in, not a key)
# (variable, what listens there)
PORTS = (
    ("PORT", "the web server"),
    ("FAKE_RENDERER_PORT", "the fake render service"),
    ("FAKE_STRIPE_PORT", "the fake Stripe"),
)


def configured(name: str) -> str:
    """The value a process started now would see: environment, .env, .env.example."""
    if os.environ.get(name):
        return os.environ[name]
    for path in (ENV_FILE, EXAMPLE_FILE):
        if path.exists():
            value = dotenv_values(path).get(name)
            if value:
                return value
    raise SystemExit(f"make run: {name} is not set (nor in .env or .env.example)")


def busy(port: int) -> bool:
    """Whether 127.0.0.1:port cannot be bound (something listens there already)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Like the servers themselves: a port in TIME_WAIT after a restart is not busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def ports() -> int:
    chosen: list[int] = []
    for name, what in PORTS:
        raw = configured(name)
        try:
            port = int(raw)
        except ValueError:
            print(f"make run: {name}={raw!r} is not a port number", file=sys.stderr)
            return 1
        if port in chosen:
            print(f"make run: {name}={port} is already used by another process of make run "
                  f"(set each of {', '.join(n for n, _ in PORTS)} apart)", file=sys.stderr)
            return 1
        if busy(port):
            print(
                f"make run: port {port} ({name}, {what}) is already in use on 127.0.0.1; "
                f"stop what listens there or choose another, e.g. {name}={port + 1} make run",
                file=sys.stderr,
            )
            return 1
        chosen.append(port)
    print(" ".join(str(port) for port in chosen))
    return 0


def ensure_env() -> int:
    """First use: .env from .env.example with a fresh random DJANGO_SECRET_KEY."""
    if ENV_FILE.exists():
        return 0
    key = secrets.token_urlsafe(50)  # 67 characters of [A-Za-z0-9_-]
    # Ports chosen for this first run (`PORT=8100 make run`) are kept, so that a command in
    # another shell, without them in its environment, reaches the same processes and database.
    names = [*(name for name, _ in PORTS), "LOCAL_POSTGRES_PORT"]
    chosen = {name: os.environ[name] for name in names if os.environ.get(name)}
    lines = []
    for line in EXAMPLE_FILE.read_text().splitlines():
        name = line.partition("=")[0].strip()
        if line.strip() == SECRET_KEY_LINE:
            line = f"{SECRET_KEY_LINE}{key}"
        elif name in chosen and not line.lstrip().startswith("#"):
            line = f"{name}={chosen[name]}"
        lines.append(line)
    ENV_FILE.write_text("\n".join(lines) + "\n")
    ENV_FILE.chmod(0o600)  # it holds a secret
    print(f"make run: wrote {ENV_FILE.name} (local settings and a new secret key; "
          f"documented in {EXAMPLE_FILE.name})")
    return 0


def main(argv: list[str]) -> int:
    commands = {"ports": ports, "ensure-env": ensure_env}
    if len(argv) != 2 or argv[1] not in commands:
        print(f"usage: {argv[0]} {{{'|'.join(commands)}}}", file=sys.stderr)
        return 2
    return commands[argv[1]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
