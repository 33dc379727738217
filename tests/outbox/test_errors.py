"""The error contract: ONE classification table (eventdrop.retry.classify) for deliveries and
side effects alike. Our own database's errors are transient, configuration is deferred
(never charged, never fatal), and what nobody classified is transient and charged."""

import pytest
from django.db import InterfaceError, OperationalError

from eventdrop.retry import Disposition, classify
from ingress.handlers import PermanentHandlerError
from ingress.payloads import UnparseablePayload
from outbox.errors import (
    EventNotFound,
    RenderBadResponse,
    RenderCircuitOpen,
    RenderConnectionFailed,
    RenderDeadlineExceeded,
    RenderHTTPError,
    RenderNotConfigured,
    RenderTimedOut,
    RenderUnhealthy,
    TooFewPhotos,
)

T, P, D = Disposition.TRANSIENT, Disposition.PERMANENT, Disposition.DEFERRED


@pytest.mark.parametrize(
    ("error", "disposition", "error_class", "service_failure"),
    [
        (RenderUnhealthy(status=503), T, "health_red", True),
        (RenderConnectionFailed(), T, "connection_error", True),
        (RenderTimedOut(phase="connect"), T, "connect_timeout", True),
        (RenderTimedOut(phase="read"), T, "read_timeout", True),
        (RenderDeadlineExceeded(seconds=10), T, "deadline_exceeded", True),
        (RenderHTTPError(status=500), T, "http_500", True),
        (RenderHTTPError(status=503), T, "http_503", True),
        (RenderHTTPError(status=429, retry_after=30), T, "http_429", True),
        (RenderCircuitOpen(until="later"), D, "circuit_open", False),
        (RenderNotConfigured(setting="RENDER_SERVICE_URL"), D, "not_configured", False),
        (RenderHTTPError(status=400), P, "http_400", False),
        (RenderHTTPError(status=404), P, "http_404", False),
        (RenderHTTPError(status=422), P, "http_422", False),
        (EventNotFound(), P, "event_not_found", False),
        (TooFewPhotos(count=1, minimum=5), P, "too_few_photos", False),
        (PermanentHandlerError("no"), P, "permanent_handler_error", False),
        (UnparseablePayload("no"), P, "unparseable_payload", False),
        # Our own database: deadlocks, serialization failures, statement and lock timeouts
        # and restarts all arrive as OperationalError (or InterfaceError on a dead
        # connection). Transient, and not the render service's fault.
        (OperationalError("deadlock detected"), T, "database:OperationalError", False),
        (OperationalError("canceling statement due to statement timeout"), T,
         "database:OperationalError", False),
        (InterfaceError("connection already closed"), T, "database:InterfaceError", False),
        # Unclassified: retried (charged), with the class name kept.
        (RenderBadResponse(), T, "unclassified:RenderBadResponse", False),
        (ValueError("x"), T, "unclassified:ValueError", False),
        (KeyError("k"), T, "unclassified:KeyError", False),
    ],
)
def test_classify(error, disposition, error_class, service_failure):
    failure = classify(error)
    assert failure.disposition == disposition
    assert failure.error_class == error_class
    assert failure.service_failure is service_failure


def test_the_psycopg_faults_we_inject_arrive_as_operational_errors():
    # What the fault tests provoke, as Django hands it over: each must be transient.
    import psycopg
    from django.db.utils import DatabaseErrorWrapper

    for raw in (
        psycopg.errors.DeadlockDetected("deadlock"),
        psycopg.errors.SerializationFailure("serialize"),
        psycopg.errors.QueryCanceled("statement timeout"),
        psycopg.errors.LockNotAvailable("lock timeout"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
    ):
        from django.db import connection

        try:
            with DatabaseErrorWrapper(connection):
                raise raw
        except Exception as wrapped:
            assert classify(wrapped).disposition == T, type(raw)


def test_retry_after_travels_with_a_429_only():
    assert classify(RenderHTTPError(status=429, retry_after=42.0)).retry_after == 42.0
    assert classify(RenderHTTPError(status=503, retry_after=42.0)).retry_after is None


def test_outbox_errors_keeps_no_second_copy_of_the_table():
    import outbox.errors

    assert not hasattr(outbox.errors, "classify")
