"""The deadline that bounds database waits within one operation (see kernel/db/__init__)."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# Monotonic time by which every database wait in this context must end; None: no deadline
# (then only the connection's own client_wait_timeout applies). A ContextVar, so each
# server thread (and each asyncio task) has its own.
_deadline: ContextVar[float | None] = ContextVar("eventdrop_database_deadline", default=None)


@contextmanager
def database_deadline(seconds: float) -> Iterator[None]:
    """Every database wait inside ends within `seconds` from now, connecting included.

    Nested deadlines never extend an outer one: the earlier of the two applies.
    """
    deadline = time.monotonic() + seconds
    outer = _deadline.get()
    token = _deadline.set(deadline if outer is None else min(outer, deadline))
    try:
        yield
    finally:
        _deadline.reset(token)


def deadline_seconds_left() -> float | None:
    """Seconds left before the current deadline (never negative), or None without one."""
    deadline = _deadline.get()
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())
