"""The base classes every domain error in this project derives from, and the error contract.

Messages are module-level constants next to each error so tests assert on them instead of
on free text.

The error contract: an error that a retry machine (deliveries, side effects) may meet says
itself how it is to be treated, by deriving from one of the three classified bases below.
`eventdrop.retry.classify` reads that (and our own database's errors) in its one table; so
the kernel names no error of an app above it, and an app adds an error without touching
the kernel.
"""

from enum import StrEnum


class EventDropError(Exception):
    """Base class of all domain errors (ingress, recaps, outbox)."""


class Disposition(StrEnum):
    TRANSIENT = "transient"  # retried with backoff, and charged (counts toward max attempts)
    PERMANENT = "permanent"  # given up at once: the row goes `dead`
    DEFERRED = "deferred"  # not the row's fault, nothing was tried: released, not charged


class ClassifiedError(EventDropError):
    """An error that carries its own retry verdict (read by `eventdrop.retry.classify`).

    `error_class` is the short machine-readable reason stored on the row (last_error_class)
    and in its history. `service_failure` says the failure is about the remote service as a
    whole (5xx, 429, timeouts, refused connections): the circuit breaker's input.
    `retry_after` is the pause the callee asked for, if any.
    """

    disposition: Disposition
    error_class: str
    service_failure: bool = False
    retry_after: float | None = None

    def __init__(
        self,
        message: str,
        *,
        disposition: Disposition,
        error_class: str,
        service_failure: bool = False,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.disposition = disposition
        self.error_class = error_class
        self.service_failure = service_failure
        self.retry_after = retry_after


class PermanentError(ClassifiedError):
    """Will never succeed on this input: given up at once. Subclasses name the reason."""

    permanent_reason = "permanent"

    def __init__(self, message: str):
        super().__init__(
            message, disposition=Disposition.PERMANENT, error_class=self.permanent_reason
        )


class DeferredError(ClassifiedError):
    """Not the row's fault and nothing was tried (the breaker said no, our configuration is
    incomplete): the row is released without being charged."""

    deferred_reason = "deferred"

    def __init__(self, message: str):
        super().__init__(
            message, disposition=Disposition.DEFERRED, error_class=self.deferred_reason
        )


class ServiceFailure(ClassifiedError):
    """The remote service failed as a whole: transient, charged, and counted by the breaker."""

    def __init__(self, message: str, *, error_class: str, retry_after: float | None = None):
        super().__init__(
            message,
            disposition=Disposition.TRANSIENT,
            error_class=error_class,
            service_failure=True,
            retry_after=retry_after,
        )
