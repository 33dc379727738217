"""The loop behind every long-running worker command (`process_inbox`,
`dispatch_side_effects`): run one pass after another until SIGTERM/SIGINT, which let the
current pass finish.

A database outage does not end the loop: the work lives in rows that stay where they are, so
the worker waits and tries again rather than dying and relying on a supervisor.
"""

import logging
import signal
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, close_old_connections

logger = logging.getLogger(__name__)

Result = TypeVar("Result")


def run_until_stopped(
    *,
    name: str,
    run_pass: Callable[[], Result],
    is_idle: Callable[[Result], bool],
    idle_sleep_seconds: float,
    write: Callable[[str], None],
    describe: Callable[[Result], str | None] = lambda result: None,
    error_sleep_seconds: float = 5.0,
) -> None:
    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    write(f"{name}: running (Ctrl-C to stop)")
    try:
        while not stopping:
            # A long-running process must drop connections the database closed meanwhile.
            close_old_connections()
            try:
                result = run_pass()
            except DatabaseError:
                logger.exception("worker.pass_failed", extra={"worker": name})
                time.sleep(error_sleep_seconds)
                continue
            line = describe(result)
            if line:
                write(f"{name}: {line}")
            if is_idle(result):
                time.sleep(idle_sleep_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    write(f"{name}: stopped")
