"""What the benches share."""

import subprocess
from collections.abc import Callable


def reusable_database(server_url: str, name: str, migrate: Callable[[], object]) -> None:
    """`name` on the server, created when missing and migrated. A database that another
    checkout migrated with migrations this one lacks (another branch, a renumbered one) does
    not migrate here: it is dropped and made again, as a first run would."""
    import psycopg
    from psycopg import sql

    def create() -> None:
        with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
            exists = "SELECT 1 FROM pg_database WHERE datname = %s"
            if not conn.execute(exists, [name]).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    create()
    try:
        migrate()
    except subprocess.CalledProcessError:
        with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            conn.execute(drop)
        create()
        migrate()


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
