"""The error contract: one function sorts every failure, unclassified means permanent."""

import pytest
from django.db import OperationalError

from outbox.errors import classify
from recaps.errors import (
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


@pytest.mark.parametrize(
    ("error", "transient", "error_class", "service_failure"),
    [
        (RenderUnhealthy(status=503), True, "health_red", True),
        (RenderConnectionFailed(), True, "connection_error", True),
        (RenderTimedOut(phase="connect"), True, "connect_timeout", True),
        (RenderTimedOut(phase="read"), True, "read_timeout", True),
        (RenderDeadlineExceeded(seconds=10), True, "deadline_exceeded", True),
        (RenderHTTPError(status=500), True, "http_500", True),
        (RenderHTTPError(status=503), True, "http_503", True),
        (RenderHTTPError(status=429, retry_after=30), True, "http_429", True),
        (RenderCircuitOpen(until="later"), True, "circuit_open", False),
        (RenderHTTPError(status=400), False, "http_400", False),
        (RenderHTTPError(status=404), False, "http_404", False),
        (RenderHTTPError(status=422), False, "http_422", False),
        (RenderNotConfigured(setting="RENDER_SERVICE_URL"), False, "not_configured", False),
        (EventNotFound(), False, "event_not_found", False),
        (TooFewPhotos(count=1, minimum=5), False, "too_few_photos", False),
        # Unclassified: the conservative default, permanent, with the class name kept.
        (RenderBadResponse(), False, "unclassified:RenderBadResponse", False),
        (ValueError("x"), False, "unclassified:ValueError", False),
        (OperationalError("db"), False, "unclassified:OperationalError", False),
        (KeyError("k"), False, "unclassified:KeyError", False),
    ],
)
def test_classify(error, transient, error_class, service_failure):
    failure = classify(error)
    assert failure.transient is transient
    assert failure.error_class == error_class
    assert failure.service_failure is service_failure


def test_retry_after_travels_with_a_429_only():
    assert classify(RenderHTTPError(status=429, retry_after=42.0)).retry_after == 42.0
    assert classify(RenderHTTPError(status=503, retry_after=42.0)).retry_after is None
