"""The finality rule as a table: ONE classification (kernel.retry.classify) and ONE decision
(RetryStrategy.decide) for deliveries and side effects alike (issue 27).

A row ends only on a verdict about it (a 422 for this request, a handler's permanent domain
error) or on N charged attempts and the horizon, where only failures that can be about the
row are charged. Every HTTP status from 300 to 599 and every class of database error is
checked here: an answer about the service, its deploy or our own database never charges a
row, however often it comes and however old the row is.
"""

import inspect
from datetime import UTC, datetime, timedelta

import psycopg
import psycopg.errors
import pytest
from django.db import connection
from django.db import utils as django_db
from django.db.utils import DatabaseErrorWrapper

from ingress.deliveries import delivery_retry_strategy
from ingress.handlers import PermanentHandlerError
from ingress.payloads import UnparseablePayload
from kernel.retry import Action, Disposition, classify
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
from outbox.services import outbox_retry_strategy

T, P, D = Disposition.TRANSIENT, Disposition.PERMANENT, Disposition.DEFERRED
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LONG_AGO = NOW - timedelta(days=30)

# The words, as sets: the one verdict, and the answers about the service or its deploy.
VERDICT = {422}
ABOUT_THE_SERVICE = (
    set(range(300, 400)) | {401, 403, 404, 405, 408, 409, 410, 425, 429} | set(range(500, 600))
)


def _expected(status: int) -> tuple[Disposition, bool, bool]:
    """(disposition, counts toward the breaker, ambiguous) of a render request's answer."""
    if status in VERDICT:
        return P, False, False
    if status in ABOUT_THE_SERVICE:
        return D, True, False
    return D, True, True  # neither a render nor a verdict: waits, and alerts


def _decisions(failure):
    """What each retry machine does with it on a row's 5th attempt, a month into its horizon."""
    for strategy in (outbox_retry_strategy(), delivery_retry_strategy()):
        yield strategy.decide(
            failure, attempts=strategy.policy.max_attempts, now=NOW, first_failed_at=LONG_AGO
        )


@pytest.mark.parametrize("status", range(300, 600))
def test_every_status_from_300_to_599(status):
    failure = classify(RenderHTTPError(status=status))
    disposition, service_failure, ambiguous = _expected(status)
    assert (failure.disposition, failure.service_failure, failure.ambiguous) == (
        disposition,
        service_failure,
        ambiguous,
    )
    assert failure.error_class == f"http_{status}"
    for decision in _decisions(failure):
        if status in VERDICT:
            assert decision.action == Action.GIVE_UP
        else:
            # Never charged, never dead: released to wait, whatever the count and the age.
            assert decision.action == Action.RELEASE and not decision.charged


# Every exception class PostgreSQL's driver defines (one per SQLSTATE, and their bases).
PSYCOPG_ERRORS = sorted(
    {
        cls
        for module in (psycopg, psycopg.errors)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, psycopg.Error)
    },
    key=lambda cls: cls.__name__,
)
DJANGO_ERRORS = [
    django_db.Error,
    django_db.InterfaceError,
    django_db.DatabaseError,
    django_db.DataError,
    django_db.OperationalError,
    django_db.IntegrityError,
    django_db.InternalError,
    django_db.ProgrammingError,
    django_db.NotSupportedError,
]


def test_the_table_really_covers_the_driver():
    names = {cls.__name__ for cls in PSYCOPG_ERRORS}
    # The ones the issue names, among some two hundred more.
    assert {
        "QueryCanceled",  # statement_timeout
        "LockNotAvailable",  # lock_timeout
        "SerializationFailure",
        "DeadlockDetected",
        "AdminShutdown",  # a restart
        "UndefinedColumn",  # code deployed ahead of its migration
        "UniqueViolation",
        "StringDataRightTruncation",
    } <= names
    assert len(PSYCOPG_ERRORS) > 200


@pytest.mark.parametrize("error_type", PSYCOPG_ERRORS, ids=lambda cls: cls.__name__)
def test_every_database_error_as_django_hands_it_over(error_type):
    """Each driver error wrapped the way Django wraps it (its DatabaseErrorWrapper), and
    raw: about us, never about the row, and no input to the render service's breaker."""
    try:
        with DatabaseErrorWrapper(connection):
            raise error_type("injected")
    except Exception as wrapped:
        errors = [wrapped, error_type("raw")]
    for error in errors:
        failure = classify(error)
        assert failure.disposition == D, type(error)
        assert failure.error_class == f"database:{error_type.__name__}"[:64]
        assert not failure.service_failure and failure.database
        for decision in _decisions(failure):
            assert decision.action == Action.RELEASE and not decision.charged


@pytest.mark.parametrize("error_type", DJANGO_ERRORS, ids=lambda cls: cls.__name__)
def test_every_django_database_error_class(error_type):
    failure = classify(error_type("x"))
    assert failure.disposition == D and not failure.service_failure
    assert failure.error_class == f"database:{error_type.__name__}"
    for decision in _decisions(failure):
        assert decision.action == Action.RELEASE


@pytest.mark.parametrize(
    ("error", "disposition", "error_class", "service_failure", "ambiguous"),
    [
        # The service, or the way to it: never charged, the breaker's input.
        (RenderUnhealthy(status=503), D, "health_red", True, False),
        (RenderConnectionFailed(), D, "connection_error", True, False),
        (RenderTimedOut(phase="connect"), D, "connect_timeout", True, False),
        (RenderTimedOut(phase="read"), D, "read_timeout", True, False),
        (RenderDeadlineExceeded(seconds=10), D, "deadline_exceeded", True, False),
        (RenderBadResponse(), D, "bad_response", True, True),
        # Nothing was asked: never charged, and nothing for the breaker.
        (RenderCircuitOpen(until="later"), D, "circuit_open", False, False),
        (RenderNotConfigured(setting="RENDER_SERVICE_URL"), D, "not_configured", False, False),
        # Verdicts about this row.
        (EventNotFound(), P, "event_not_found", False, False),
        (TooFewPhotos(count=1, minimum=5), P, "too_few_photos", False, False),
        (PermanentHandlerError("no"), P, "permanent_handler_error", False, False),
        (UnparseablePayload("no"), P, "unparseable_payload", False, False),
        # Unclassified (our code failing on this row's data): retried, charged, the class
        # name kept; dead only after N charged attempts and the horizon.
        (ValueError("x"), T, "unclassified:ValueError", False, False),
        (KeyError("k"), T, "unclassified:KeyError", False, False),
    ],
)
def test_classify(error, disposition, error_class, service_failure, ambiguous):
    failure = classify(error)
    assert failure.disposition == disposition
    assert failure.error_class == error_class
    assert failure.service_failure is service_failure
    assert failure.ambiguous is ambiguous


def test_only_what_may_be_the_rows_own_failure_is_charged_and_only_it_dies_of_age():
    own = classify(KeyError("k"))
    for decision in _decisions(own):
        assert decision.action == Action.GIVE_UP  # N charged attempts AND the horizon
    for strategy in (outbox_retry_strategy(), delivery_retry_strategy()):
        young = strategy.decide(
            own, attempts=strategy.policy.max_attempts, now=NOW, first_failed_at=NOW
        )
        assert young.action == Action.RETRY  # the horizon has not passed: alive


def test_retry_after_travels_with_a_429_and_a_503_only():
    assert classify(RenderHTTPError(status=429, retry_after=42.0)).retry_after == 42.0
    assert classify(RenderHTTPError(status=503, retry_after=42.0)).retry_after == 42.0
    assert classify(RenderHTTPError(status=500, retry_after=42.0)).retry_after is None


def test_outbox_errors_keeps_no_second_copy_of_the_table():
    import outbox.errors

    assert not hasattr(outbox.errors, "classify")
