"""The loop behind the worker commands: survives a database outage, stops on SIGTERM."""

import os
import signal

import pytest
from django.db import OperationalError

from eventdrop.worker_loop import run_until_stopped

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
