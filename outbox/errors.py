"""Errors of the outbox: why a render could not be requested, and operator actions refused.

Each render error says how a retry machine treats it by its base class (the error contract,
eventdrop/errors.py): DeferredError (nothing asked, nothing charged), ServiceFailure (the
service failed as a whole: transient, charged, the breaker's input) or PermanentError; the one
table that reads it is `eventdrop.retry.classify` (docs/outbox.md, "The error contract").
"""

from eventdrop.errors import (
    ClassifiedError,
    DeferredError,
    Disposition,
    EventDropError,
    PermanentError,
    ServiceFailure,
)

EVENT_NOT_FOUND = "The recap's event no longer exists."
TOO_FEW_PHOTOS = "The event has {count} photos; a recap needs at least {minimum}."

RENDER_NOT_CONFIGURED = "The render service is not configured ({setting} is empty)."
RENDER_UNHEALTHY = "The render service health check answered {status}."
RENDER_CONNECTION_FAILED = "Could not connect to the render service."
RENDER_TIMED_OUT = "The render service did not answer within the {phase} timeout."
RENDER_DEADLINE_EXCEEDED = "The render service call ran past its {seconds:.1f} s deadline."
RENDER_HTTP_ERROR = "The render service answered HTTP {status}."
RENDER_BAD_RESPONSE = "The render service answered 2xx without a render id."
RENDER_CIRCUIT_OPEN = "The render service circuit breaker is open until {until}."

SIDE_EFFECT_IN_FLIGHT = (
    "Side effect #{id} is being dispatched right now; it can be re-armed once it has been "
    "processing for longer than {stale} s (its worker died)."
)
SIDE_EFFECT_ALREADY_DONE = "Side effect #{id} is done; retry the recap's render instead."
SIDE_EFFECT_ALREADY_DEAD = "Side effect #{id} is already dead."
SIDE_EFFECT_REASON_REQUIRED = "Give a reason: it is kept as the recap's failure reason."


class OutboxError(EventDropError):
    """An operator action on the outbox that cannot be done (refused, nothing changed)."""


# --- why a render could not be requested (classified in eventdrop/retry.py) ------------------


class RenderError(EventDropError):
    """Requesting a render failed; see eventdrop/retry.py for transient vs permanent."""


class EventNotFound(RenderError, PermanentError):
    permanent_reason = "event_not_found"

    def __init__(self, message: str = EVENT_NOT_FOUND):
        super().__init__(message)


class TooFewPhotos(RenderError, PermanentError):
    permanent_reason = "too_few_photos"

    def __init__(self, *, count: int, minimum: int):
        super().__init__(TOO_FEW_PHOTOS.format(count=count, minimum=minimum))
        self.count = count
        self.minimum = minimum


class RenderNotConfigured(RenderError, DeferredError):
    """Our configuration is incomplete: not the row's fault. The dispatcher refuses to start
    without it; a row that meets it anyway is released, never charged, never killed."""

    deferred_reason = "not_configured"

    def __init__(self, *, setting: str):
        super().__init__(RENDER_NOT_CONFIGURED.format(setting=setting))


class RenderUnhealthy(RenderError, ServiceFailure):
    def __init__(self, *, status: int):
        super().__init__(RENDER_UNHEALTHY.format(status=status), error_class="health_red")
        self.status = status


class RenderConnectionFailed(RenderError, ServiceFailure):
    def __init__(self) -> None:
        super().__init__(RENDER_CONNECTION_FAILED, error_class="connection_error")


class RenderTimedOut(RenderError, ServiceFailure):
    """No answer within the connect or read timeout: the request may or may not have
    arrived (an *ambiguous* failure), which is why every render request carries an
    idempotency key."""

    def __init__(self, *, phase: str):
        super().__init__(RENDER_TIMED_OUT.format(phase=phase), error_class=f"{phase}_timeout")
        self.phase = phase


class RenderDeadlineExceeded(RenderError, ServiceFailure):
    """The call's total deadline passed (a slow drip: every read came in time, the whole
    answer did not)."""

    def __init__(self, *, seconds: float):
        super().__init__(
            RENDER_DEADLINE_EXCEEDED.format(seconds=seconds), error_class="deadline_exceeded"
        )


class RenderHTTPError(RenderError, ClassifiedError):
    """429 and 5xx are the service failing (429 with the pause it asked for); any other
    status is our request refused, which no retry changes."""

    def __init__(self, *, status: int, retry_after: float | None = None):
        service_failure = status == 429 or status >= 500
        super().__init__(
            RENDER_HTTP_ERROR.format(status=status),
            disposition=Disposition.TRANSIENT if service_failure else Disposition.PERMANENT,
            error_class=f"http_{status}",
            service_failure=service_failure,
            retry_after=retry_after if status == 429 else None,
        )
        self.status = status


class RenderBadResponse(RenderError):
    def __init__(self) -> None:
        super().__init__(RENDER_BAD_RESPONSE)


class RenderCircuitOpen(RenderError, DeferredError):
    """Skipped without a network call: the breaker is open (or another probe is running).
    Nothing was asked, nothing is charged."""

    deferred_reason = "circuit_open"

    def __init__(self, *, until: str):
        super().__init__(RENDER_CIRCUIT_OPEN.format(until=until))
