"""What the benches share."""

import subprocess
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def reusable_database(
    server_url: str, name: str, migrate: Callable[[], object], root: Path = ROOT
) -> None:
    """`name` on the server, created when missing and migrated. A database that another
    checkout migrated with migrations this one lacks (another branch, a renumbered one) is
    dropped and made again, as a first run would: its tables may hold columns this one lacks."""
    import psycopg
    from psycopg import sql

    def create() -> None:
        with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
            exists = "SELECT 1 FROM pg_database WHERE datname = %s"
            if not conn.execute(exists, [name]).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop() -> None:
        with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
            statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(statement.format(sql.Identifier(name)))

    create()
    if foreign_migrations(f"{server_url}/{name}", root):
        drop()
        create()
    try:
        migrate()
    except subprocess.CalledProcessError:
        drop()
        create()
        migrate()


def foreign_migrations(database_url: str, root: Path) -> list[str]:
    """Migrations applied to the database that `root`'s apps do not have on disk."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        table = conn.execute("SELECT to_regclass('django_migrations')").fetchone()
        if table is None or table[0] is None:
            return []
        applied = conn.execute("SELECT app, name FROM django_migrations").fetchall()
    return [
        f"{app}.{migration}"
        for app, migration in applied
        if (root / app / "migrations").is_dir()
        and not (root / app / "migrations" / f"{migration}.py").exists()
    ]


# bench/console_scale.py's stand-ins for a deployment's GitHub and Slack handlers (registered
# by that bench only): its store's deliveries name them, as a real store names handlers that
# are registered.


def github_push(event: object, payload: dict) -> None:
    """Nothing: the console bench never runs a handler."""


def slack_message(event: object, payload: dict) -> None:
    """Nothing: the console bench never runs a handler."""


def register_console_bench_handlers() -> None:
    from ingress.handlers import webhook_handler

    webhook_handler(provider="github", event_types=["push"])(github_push)
    webhook_handler(provider="slack", event_types=["event_callback"])(slack_message)
