"""The handlers of the worker-death tests (see the package docstring)."""

import os
import signal

from django.db import connection

from ingress.handlers import webhook_handler
from tests.ingress.worker_killer.marks import GATE_LOCK, GATED, KILL_IN_HANDLER, ORDINARY


@webhook_handler(provider="stripe", event_types=[KILL_IN_HANDLER])
def kill_the_worker(event, payload) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@webhook_handler(provider="stripe", event_types=[ORDINARY])
def handle_ordinary(event, payload) -> None:
    return None


@webhook_handler(provider="stripe", event_types=[GATED])
def handle_when_the_gate_opens(event, payload) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock_shared(%s)", [GATE_LOCK])
