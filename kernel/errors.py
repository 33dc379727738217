"""The base classes every domain error in this project derives from, and the error contract.

Messages are module-level constants next to each error so tests assert on them instead of
on free text.

The error contract: an error that a retry machine (deliveries, side effects) may meet says
itself how it is to be treated, by deriving from one of the classified bases below.
`kernel.retry.classify` reads that (and our own database's errors) in its one table; so
the kernel names no error of an app above it, and an app adds an error without touching
the kernel. The finality rule those dispositions serve is written once, in
kernel/retry.py and docs/outbox.md ("The finality rule").
"""

from enum import StrEnum


class EventDropError(Exception):
    """Base class of all domain errors (ingress, recaps, outbox)."""


class Disposition(StrEnum):
    # A verdict about this row: given up at once, the row goes `dead`.
    PERMANENT = "permanent"
    # May be about this row (our code failing on its data, an error nobody classified):
    # retried with backoff and charged; `dead` only after N charged attempts AND the horizon.
    TRANSIENT = "transient"
    # Not about this row — the remote service or its deploy, our own database or
    # configuration, or nothing was asked at all (the breaker open): released, never charged.
    DEFERRED = "deferred"


class ClassifiedError(EventDropError):
    """An error that carries its own retry verdict (read by `kernel.retry.classify`).

    `error_class` is the short machine-readable reason stored on the row (last_error_class)
    and in its history. `service_failure` says the answer is about the remote service as a
    whole or its deploy (5xx, 429, 3xx, 404 from a route without endpoints, timeouts,
    refused connections): the circuit breaker's input. `ambiguous` says the answer is
    neither a success nor a verdict about the row (a 400 from a gateway, a 2xx without a
    render id): the row waits, and an alert fires. `retry_after` is the pause the callee
    asked for, if any.
    """

    disposition: Disposition
    error_class: str
    service_failure: bool = False
    ambiguous: bool = False
    retry_after: float | None = None

    def __init__(
        self,
        message: str,
        *,
        disposition: Disposition,
        error_class: str,
        service_failure: bool = False,
        ambiguous: bool = False,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.disposition = disposition
        self.error_class = error_class
        self.service_failure = service_failure
        self.ambiguous = ambiguous
        self.retry_after = retry_after


class PermanentError(ClassifiedError):
    """A verdict about this row: it will never succeed on this input. Given up at once.
    Subclasses name the reason."""

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
    """The remote service (or its deploy) failed or answered about itself: never charged to
    the row, and counted by the breaker. `ambiguous`: the answer was neither a success nor a
    verdict about the row (the row waits, an alert fires)."""

    def __init__(
        self,
        message: str,
        *,
        error_class: str,
        retry_after: float | None = None,
        ambiguous: bool = False,
    ):
        super().__init__(
            message,
            disposition=Disposition.DEFERRED,
            error_class=error_class,
            service_failure=True,
            ambiguous=ambiguous,
            retry_after=retry_after,
        )
