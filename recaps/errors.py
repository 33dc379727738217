"""Domain errors of recaps and of the render-service client.

Messages are constants (tests assert on them) and never quote payloads or secrets. Whether a
render error is worth another attempt is decided in one place, eventdrop/retry.py.
"""

from eventdrop.errors import EventDropError

RECAP_NOT_FOUND = "Recap not found."
RECAP_NOT_YOURS = "This recap belongs to another user."
RECAP_NOT_FREE = "This recap is not free; buy it through checkout."
RECAP_IS_FREE = "This recap is free; redeem it instead of paying."
RECAP_ALREADY_REDEEMED = "This recap has already been redeemed."
RECAP_ALREADY_PAID = "This recap has already been paid with another payment."
RECAP_NOT_PAYABLE = "Only a recap waiting for payment can be paid."
RECAP_NOT_RETRYABLE = "Only a paid, rendering or failed recap can be rendered again."
RECAP_NOT_RENDERED = "This recap was never sent to the render service."
EVENT_NOT_FOUND = "The recap's event no longer exists."
EVENT_UNKNOWN = "Event not found."
TOO_FEW_PHOTOS = "The event has {count} photos; a recap needs at least {minimum}."
CHECKOUT_NOT_CONFIGURED = "Stripe is not configured (STRIPE_API_KEY)."
CHECKOUT_UNAVAILABLE = "Stripe did not create a checkout session; try again."

RENDER_NOT_CONFIGURED = "The render service is not configured ({setting} is empty)."
RENDER_UNHEALTHY = "The render service health check answered {status}."
RENDER_CONNECTION_FAILED = "Could not connect to the render service."
RENDER_TIMED_OUT = "The render service did not answer within the {phase} timeout."
RENDER_DEADLINE_EXCEEDED = "The render service call ran past its {seconds:.1f} s deadline."
RENDER_HTTP_ERROR = "The render service answered HTTP {status}."
RENDER_BAD_RESPONSE = "The render service answered 2xx without a render id."
RENDER_CIRCUIT_OPEN = "The render service circuit breaker is open until {until}."


class RecapError(EventDropError):
    """A recap request that cannot be honoured (maps to a 4xx)."""


class RecapNotFound(RecapError):
    def __init__(self, message: str = RECAP_NOT_FOUND):
        super().__init__(message)


class EventUnknown(RecapError):
    def __init__(self, message: str = EVENT_UNKNOWN):
        super().__init__(message)


class RecapPermissionDenied(RecapError):
    pass


class RecapStateConflict(RecapError):
    """The recap is not in a state that allows this (already redeemed, paid twice, …)."""


class RecapAlreadyRedeemed(RecapStateConflict):
    def __init__(self, message: str = RECAP_ALREADY_REDEEMED):
        super().__init__(message)


class RecapAlreadyPaid(RecapStateConflict):
    def __init__(self, message: str = RECAP_ALREADY_PAID):
        super().__init__(message)


class CheckoutError(EventDropError):
    """Creating a Stripe Checkout Session failed (maps to a 5xx: not the buyer's fault)."""


class CheckoutNotConfigured(CheckoutError):
    def __init__(self, message: str = CHECKOUT_NOT_CONFIGURED):
        super().__init__(message)


class CheckoutUnavailable(CheckoutError):
    def __init__(self, message: str = CHECKOUT_UNAVAILABLE):
        super().__init__(message)


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
