"""Errors of the outbox: why a render could not be requested, and operator actions refused.

Which failures of a dispatch earn another attempt is not decided here: the one
classification table for deliveries and side effects alike is `eventdrop.retry.classify`
(docs/outbox.md, "The error contract").
"""

from eventdrop.errors import EventDropError

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


class EventNotFound(RenderError):
    def __init__(self, message: str = EVENT_NOT_FOUND):
        super().__init__(message)


class TooFewPhotos(RenderError):
    def __init__(self, *, count: int, minimum: int):
        super().__init__(TOO_FEW_PHOTOS.format(count=count, minimum=minimum))
        self.count = count
        self.minimum = minimum


class RenderNotConfigured(RenderError):
    def __init__(self, *, setting: str):
        super().__init__(RENDER_NOT_CONFIGURED.format(setting=setting))


class RenderUnhealthy(RenderError):
    def __init__(self, *, status: int):
        super().__init__(RENDER_UNHEALTHY.format(status=status))
        self.status = status


class RenderConnectionFailed(RenderError):
    def __init__(self) -> None:
        super().__init__(RENDER_CONNECTION_FAILED)


class RenderTimedOut(RenderError):
    """No answer within the connect or read timeout: the request may or may not have
    arrived (an *ambiguous* failure), which is why every render request carries an
    idempotency key."""

    def __init__(self, *, phase: str):
        super().__init__(RENDER_TIMED_OUT.format(phase=phase))
        self.phase = phase


class RenderDeadlineExceeded(RenderError):
    """The call's total deadline passed (a slow drip: every read came in time, the whole
    answer did not)."""

    def __init__(self, *, seconds: float):
        super().__init__(RENDER_DEADLINE_EXCEEDED.format(seconds=seconds))


class RenderHTTPError(RenderError):
    def __init__(self, *, status: int, retry_after: float | None = None):
        super().__init__(RENDER_HTTP_ERROR.format(status=status))
        self.status = status
        self.retry_after = retry_after


class RenderBadResponse(RenderError):
    def __init__(self) -> None:
        super().__init__(RENDER_BAD_RESPONSE)


class RenderCircuitOpen(RenderError):
    """Skipped without a network call: the breaker is open (or another probe is running)."""

    def __init__(self, *, until: str):
        super().__init__(RENDER_CIRCUIT_OPEN.format(until=until))
