"""The loop behind the worker commands: survives a database outage, stops on SIGTERM."""

import logging
import os
import signal
import time

import pytest
from django.db import OperationalError

from kernel.worker_loop import error_backoff, run_until_stopped

# close_old_connections() between passes touches the connection.
pytestmark = pytest.mark.django_db


def test_survives_database_errors_and_finishes_the_pass_on_sigterm():
    passes: list[int] = []

    def run_pass() -> int:
        passes.append(len(passes) + 1)
        if len(passes) == 1:
            raise OperationalError("the database is restarting")
        if len(passes) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-pass; the pass still completes
        return len(passes)

    lines: list[str] = []
    before = signal.getsignal(signal.SIGTERM)
    run_until_stopped(
        name="worker",
        run_pass=run_pass,
        is_idle=lambda result: result % 2 == 0,
        idle_sleep_seconds=0,
        error_sleep_seconds=0,
        write=lines.append,
        describe=lambda result: f"pass {result}",
    )
    assert passes == [1, 2, 3]
    assert lines == [
        "worker: running (Ctrl-C to stop)",
        "worker: pass 2",
        "worker: pass 3",
        "worker: stopped",
    ]
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_survives_any_exception_logs_one_line_per_kind_and_recovers(caplog):
    """The last net behind per-row isolation: not only database errors. A UnicodeEncodeError
    once ended `process_inbox` with exit 1 on every start."""
    failures = [
        UnicodeEncodeError("utf-8", "x\ud800", 1, 2, "surrogates not allowed"),
        RuntimeError("a bug, quoting the payload {secret: 1}"),
        RuntimeError("the same bug again"),
        OperationalError("the database is restarting"),
    ]
    passes: list[int] = []

    def run_pass() -> int:
        passes.append(len(passes) + 1)
        if failures:
            raise failures.pop(0)
        if len(passes) == 6:
            os.kill(os.getpid(), signal.SIGTERM)
        return len(passes)

    lines: list[str] = []
    with caplog.at_level(logging.WARNING, logger="kernel.worker_loop"):
        run_until_stopped(
            name="worker",
            run_pass=run_pass,
            is_idle=lambda result: False,
            idle_sleep_seconds=0,
            error_sleep_seconds=0,
            write=lines.append,
        )
    assert passes == [1, 2, 3, 4, 5, 6]
    assert lines == ["worker: running (Ctrl-C to stop)", "worker: stopped"]
    records = [(r.getMessage(), getattr(r, "error", None)) for r in caplog.records]
    assert records == [
        ("worker.pass_failed", "builtins.UnicodeEncodeError"),
        ("worker.pass_failed", "builtins.RuntimeError"),  # once, though it failed twice
        ("worker.pass_failed", "django.db.utils.OperationalError"),
        ("worker.recovered", None),
    ]
    first = caplog.records[0]
    assert (first.failures, first.where.split(" in ")[-1]) == (1, "run_pass")
    assert caplog.records[3].failures == 4
    # Never the message: it may quote a payload.
    assert "secret" not in caplog.text and "payload" not in caplog.text


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(1, 5.0), (2, 10.0), (3, 20.0), (4, 40.0), (5, 60.0), (50, 60.0)],
)
def test_error_backoff_doubles_up_to_the_cap(failures, expected):
    assert error_backoff(failures, base_seconds=5.0, cap_seconds=60.0) == expected


def test_sigterm_cuts_a_long_backoff_short():
    def run_pass() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        raise RuntimeError("fails, then waits an hour")

    lines: list[str] = []
    started = time.monotonic()
    run_until_stopped(
        name="worker",
        run_pass=run_pass,
        is_idle=lambda result: False,
        idle_sleep_seconds=0,
        error_sleep_seconds=3600,
        write=lines.append,
    )
    assert time.monotonic() - started < 5
    assert lines[-1] == "worker: stopped"
