"""Domain errors of recaps (the purchase and the recap's status).

Messages are constants (tests assert on them) and never quote payloads or secrets. The render
service's errors are the outbox's (outbox/errors.py): only the outbox calls that service.
"""

from kernel.errors import EventDropError

RECAP_NOT_FOUND = "Recap not found."
RECAP_NOT_YOURS = "This recap belongs to another user."
RECAP_NOT_FREE = "This recap is not free; buy it through checkout."
RECAP_IS_FREE = "This recap is free; redeem it instead of paying."
RECAP_ALREADY_REDEEMED = "This recap has already been redeemed."
RECAP_ALREADY_PAID = "This recap has already been paid with another payment."
RECAP_NOT_PAYABLE = "Only a recap waiting for payment can be paid."
RECAP_NOT_RETRYABLE = "Only a paid or failed recap can be rendered again."
RECAP_RENDER_IN_FLIGHT = (
    "Render {render_id} of this recap is under way, and a recap has at most one render "
    "outstanding. Its callback or the status check (due {check_at}) says how it ends: a "
    "failed render can be retried then, and a render the service lost is asked for again "
    "by itself."
)
RECAP_NOT_RENDERED = "This recap was never sent to the render service."
RECAP_PAYMENT_PAID_ANOTHER = "This payment already paid for another recap: refund one of them."
RECAP_PAYMENT_FAILED_TOO_LATE = (
    "The payment failed after the recap was sent to the render service (it is {status}): "
    "chase the payment or write it off; the recap is not taken back."
)
RECAP_RENDER_ALREADY_REQUESTED = (
    "The payment failed, but the render was already requested: chase the payment or write "
    "it off; the recap is not taken back."
)
EVENT_UNKNOWN = "Event not found."
CHECKOUT_NOT_CONFIGURED = "Stripe is not configured (STRIPE_API_KEY)."
CHECKOUT_UNAVAILABLE = "Stripe did not create a checkout session; try again."


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
