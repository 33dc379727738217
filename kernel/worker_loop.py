"""The loop behind every long-running worker command (`process_inbox`,
`dispatch_side_effects`): run one pass after another until SIGTERM/SIGINT, which let the
current pass finish.

A failing pass does not end the loop. The work lives in rows that stay where they are, so
the worker waits and tries again rather than dying and relying on a supervisor (which would
only restart it into the same failure). Isolation is the passes' own job — one bad row is
set aside by the code that handles it (ingress/inbox.py) — so this catch-all is the last
net, for a database outage and for anything that isolation missed: it logs one line per
kind of failure, with where it was raised but never its message (which may quote a
payload), and backs off exponentially while the failure lasts.
"""

import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import TypeVar

from django.db import close_old_connections

from kernel.logformat import raised_at

logger = logging.getLogger(__name__)

Result = TypeVar("Result")

# A pause is slept in slices this long so that SIGTERM ends a long backoff promptly.
_PAUSE_SLICE_SECONDS = 0.25
# The longest pause after failed passes: half the verification-lag SLO (60 s), so a recovered
# database is back at work soon. The inbox's claim lease is held against it (ingress.W012).
MAX_ERROR_SLEEP_SECONDS = 30.0


def error_backoff(failures: int, *, base_seconds: float, cap_seconds: float) -> float:
    """Seconds to wait after `failures` failed passes in a row: base, twice that, … ≤ cap."""
    return min(cap_seconds, base_seconds * 2 ** max(failures - 1, 0))


def run_until_stopped(
    *,
    name: str,
    run_pass: Callable[[], Result],
    is_idle: Callable[[Result], bool],
    idle_sleep_seconds: float,
    write: Callable[[str], None],
    describe: Callable[[Result], str | None] = lambda result: None,
    error_sleep_seconds: float = 5.0,
    max_error_sleep_seconds: float = MAX_ERROR_SLEEP_SECONDS,
) -> None:
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    def pause(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not stopping and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, _PAUSE_SLICE_SECONDS))

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    write(f"{name}: running (Ctrl-C to stop)")
    failures = 0  # consecutive failed passes
    reported: set[str] = set()  # kinds of failure already logged since the last good pass
    try:
        while not stopping:
            try:
                # A long-running process must drop connections the database closed meanwhile.
                close_old_connections()
                result = run_pass()
            except Exception as exc:
                failures += 1
                wait = error_backoff(
                    failures, base_seconds=error_sleep_seconds, cap_seconds=max_error_sleep_seconds
                )
                kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
                if kind not in reported:
                    reported.add(kind)
                    logger.error(
                        "worker.pass_failed",
                        extra={
                            "worker": name,
                            "error": kind,
                            "where": raised_at(exc),
                            "failures": failures,
                            "retry_in": wait,
                        },
                    )
                pause(wait)
                continue
            if failures:
                logger.warning("worker.recovered", extra={"worker": name, "failures": failures})
                failures = 0
                reported.clear()
            line = describe(result)
            if line:
                write(f"{name}: {line}")
            if is_idle(result):
                pause(idle_sleep_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    write(f"{name}: stopped")
