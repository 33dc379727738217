"""Errors of the outbox: why a render could not be requested, and operator actions refused.

Each render error says how a retry machine treats it by its base class (the error contract,
kernel/errors.py): DeferredError (nothing asked, nothing charged), ServiceFailure (the
service or its deploy answered about itself: never charged, the breaker's input) or
PermanentError (a verdict about this recap); the one table that reads it is
`kernel.retry.classify` (docs/outbox.md, "The finality rule").
"""

from kernel.errors import (
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
RENDER_BAD_RESPONSE = (
    "The render service answered 2xx with nothing we can act on (no render id, not JSON, or "
    "an unknown state)."
)
RENDER_CIRCUIT_OPEN = "The render service circuit breaker is open until {until}."

SIDE_EFFECT_IN_FLIGHT = (
    "Side effect #{id} is being dispatched right now by a worker that lives; it is re-armed "
    "by itself once that worker is gone ({ttl:g} s without a heartbeat)."
)
RENDER_CALLBACK_BEFORE_PAYMENT = (
    "A render callback for a recap whose payment this database has not handled yet; retried "
    "until the payment is."
)
SIDE_EFFECT_ALREADY_DONE = "Side effect #{id} is done; retry the recap's render instead."
SIDE_EFFECT_ALREADY_DEAD = "Side effect #{id} is already dead."
SIDE_EFFECT_REASON_REQUIRED = "Give a reason: it is kept as the recap's failure reason."


class OutboxError(EventDropError):
    """An operator action on the outbox that cannot be done (refused, nothing changed)."""


# --- why a render could not be requested (classified in kernel/retry.py) ------------------


class RenderError(EventDropError):
    """Requesting a render failed; see kernel/retry.py for transient vs permanent."""


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


# The render service's contract (outbox/handlers.py and docs/outbox.md): 422 is its one
# verdict about a request ("this recap cannot be rendered"). These statuses are answers about
# the service, its deploy or the route to it — a redirect to a maintenance page, 401/403
# from a proxy whose credentials rotated, 404 from an ingress without endpoints, 405, 408,
# 409 (the Idempotency-Key draft: the first request with this key is still in flight), 410,
# 425, 429 — and never about the recap. Every other status is ambiguous: neither a render
# nor a verdict.
VERDICT_STATUSES = frozenset({422})
SERVICE_STATUSES = frozenset({401, 403, 404, 405, 408, 409, 410, 425, 429})


def service_answer(status: int) -> bool:
    """Is this status an answer about the service or its deploy (not about the recap)?"""
    return 300 <= status < 400 or status in SERVICE_STATUSES or 500 <= status < 600


class RenderHTTPError(RenderError, ClassifiedError):
    """A non-2xx answer, classified by its status (the tables above): 422 is a verdict about
    this request (permanent); an answer about the service or its deploy is never charged
    and counts toward the breaker; anything else is ambiguous (never charged either, the
    breaker counts it, and the row waits with an alert)."""

    def __init__(self, *, status: int, retry_after: float | None = None):
        verdict = status in VERDICT_STATUSES
        super().__init__(
            RENDER_HTTP_ERROR.format(status=status),
            disposition=Disposition.PERMANENT if verdict else Disposition.DEFERRED,
            error_class=f"http_{status}",
            service_failure=not verdict,
            ambiguous=not verdict and not service_answer(status),
            retry_after=retry_after if status in (429, 503) else None,
        )
        self.status = status


class RenderBadResponse(RenderError, ServiceFailure):
    """A 2xx we cannot act on (no render id, not JSON, an unknown state): a maintenance
    page answering 200, say. Neither a render nor a verdict: ambiguous."""

    def __init__(self) -> None:
        super().__init__(RENDER_BAD_RESPONSE, error_class="bad_response", ambiguous=True)


class RenderCircuitOpen(RenderError, DeferredError):
    """Skipped without a network call: the breaker is open (or another probe is running).
    Nothing was asked, nothing is charged."""

    deferred_reason = "circuit_open"

    def __init__(self, *, until: str):
        super().__init__(RENDER_CIRCUIT_OPEN.format(until=until))


class RenderCallbackBeforePayment(ClassifiedError):
    """A signed callback about a recap that is still unpaid here: no verdict about the
    callback, only a sign that this database is behind — the payment's own delivery has not
    run yet (another region processed the payment and rendered, and its state had not
    replicated when processing moved here; or the payment is held by a pause). Retried
    with backoff like any handler error that may be about its row: `dead` only after N
    charged attempts and the horizon, never at once."""

    def __init__(self) -> None:
        super().__init__(
            RENDER_CALLBACK_BEFORE_PAYMENT,
            disposition=Disposition.TRANSIENT,
            error_class="callback_before_payment",
        )
