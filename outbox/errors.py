"""The outbox's error contract: which failures earn another attempt.

Transient (back to `pending`, retried with backoff; only the dead path after the last
attempt writes a terminal state):
    render-service health red, connection error, connect or read timeout, a call that ran
    past its deadline, HTTP 5xx, HTTP 429 (honouring Retry-After), circuit breaker open.
Permanent (`dead` at once, the recap `failed` with the reason):
    HTTP 4xx other than 429, missing configuration, event not found, too few photos.
Anything else is *unclassified* and treated as permanent. That is the conservative default
the seed insists on: a new error source keeps the old, known behaviour (stop and show it)
until somebody classifies it here, instead of being retried blindly for hours.

`classify` is the only place this decision is made; the dispatcher, the render client's
in-call retry and the circuit breaker all ask it.
"""

from dataclasses import dataclass

from eventdrop.errors import EventDropError
from recaps.errors import (
    EventNotFound,
    RenderCircuitOpen,
    RenderConnectionFailed,
    RenderDeadlineExceeded,
    RenderHTTPError,
    RenderNotConfigured,
    RenderTimedOut,
    RenderUnhealthy,
    TooFewPhotos,
)

SIDE_EFFECT_IN_FLIGHT = (
    "Side effect #{id} is being dispatched right now; it can be re-armed once it has been "
    "processing for longer than {stale} s (its worker died)."
)
SIDE_EFFECT_ALREADY_DONE = "Side effect #{id} is done; retry the recap's render instead."
SIDE_EFFECT_ALREADY_DEAD = "Side effect #{id} is already dead."
SIDE_EFFECT_REASON_REQUIRED = "Give a reason: it is kept as the recap's failure reason."


class OutboxError(EventDropError):
    """An operator action on the outbox that cannot be done (refused, nothing changed)."""


@dataclass(frozen=True)
class Failure:
    transient: bool
    # Short machine-readable class, stored on the row (last_error_class) and in history.
    error_class: str
    # Seconds the callee asked us to wait (Retry-After), if it did.
    retry_after: float | None = None
    # Whether it says something about the render service's health (feeds the breaker).
    service_failure: bool = False


def classify(exc: BaseException) -> Failure:
    """Sort one failure into transient or permanent (see the module docstring)."""
    match exc:
        case RenderCircuitOpen():
            return Failure(transient=True, error_class="circuit_open")
        case RenderUnhealthy():
            return Failure(transient=True, error_class="health_red", service_failure=True)
        case RenderTimedOut(phase=phase):
            return Failure(transient=True, error_class=f"{phase}_timeout", service_failure=True)
        case RenderDeadlineExceeded():
            return Failure(transient=True, error_class="deadline_exceeded", service_failure=True)
        case RenderConnectionFailed():
            return Failure(transient=True, error_class="connection_error", service_failure=True)
        case RenderHTTPError(status=429, retry_after=retry_after):
            return Failure(
                transient=True,
                error_class="http_429",
                retry_after=retry_after,
                service_failure=True,
            )
        case RenderHTTPError(status=status) if status >= 500:
            return Failure(transient=True, error_class=f"http_{status}", service_failure=True)
        case RenderHTTPError(status=status):
            return Failure(transient=False, error_class=f"http_{status}")
        case RenderNotConfigured():
            return Failure(transient=False, error_class="not_configured")
        case EventNotFound():
            return Failure(transient=False, error_class="event_not_found")
        case TooFewPhotos():
            return Failure(transient=False, error_class="too_few_photos")
    return Failure(transient=False, error_class=f"unclassified:{type(exc).__name__}"[:64])
