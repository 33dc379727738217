"""Why a reconciliation run could not start, stopped early, or failed.

Three kinds, because the run record needs to know which one happened:

- `ReconcileInvalid`: the request itself is wrong (a window that ends before it starts, an
  unknown source). Nothing is started or recorded; the command says so and exits.
- `ReconcileFailed`: the run cannot compare anything — the provider refused our credentials
  (401/403) or the client is not configured. The run is recorded `failed` with the message.
- `ReconcileStopped`: the run stopped early — rate limit, page limit, time budget, provider
  unavailable after the bounded retries. What it compared and repaired so far stands; the
  run is recorded `incomplete` and the next run (or a narrower window) covers the rest.

Messages are constants so tests assert on them. None of them ever contains a key or token.
"""

from kernel.errors import EventDropError

WINDOW_EMPTY = "The window is empty: --since {since} is not before --until {until}."
WINDOW_NOT_ISO = "{option} must be an ISO 8601 datetime with a zone, got {value!r}."
UNKNOWN_SOURCE = "No webhook source {source!r} with provider {provider!r} is configured."
RUN_BUSY = "Reconciliation run #{id} for {what} is still running (started {started})."

NOT_CONFIGURED = "{setting} is not set: cannot reconcile {provider}."
NOT_TLS = (
    "{setting} is {url!r}: refusing to {purpose} over plain HTTP (only loopback may skip TLS)."
)
TOO_MANY_TYPES = (
    "RECONCILE_STRIPE_EVENT_TYPES lists {count} event types; Stripe filters on at most 20."
)
BAD_HOOK = "GitHub hook spec {spec!r} is not owner/repo:HOOK_ID or org:HOOK_ID."

AUTH_REFUSED = "{provider} refused our credentials (HTTP {status}): check {setting}."
PERMISSION_DENIED = (
    "{provider} denied access (HTTP {status}): {setting} lacks the permission {needed}."
)
REQUEST_REFUSED = "{provider} refused the request (HTTP {status}): {detail}"
RATE_LIMITED = "{provider} rate limit hit (HTTP {status}{wait}): stopped after {pages} page(s)."
UNAVAILABLE = "{provider} unavailable ({detail}): stopped after {pages} page(s)."
PAGE_LIMIT = (
    "Stopped at the page limit ({pages} pages, RECONCILE_MAX_PAGES) before the window was "
    "covered: run again with a narrower window or a higher limit."
)
FOREIGN_NEXT_LINK = (
    "GitHub's next-page link points outside {base!r}: not following it (the token would go "
    "with it)."
)
INTERRUPTED = "Interrupted ({error_class}) after {pages} page(s)."


class ReconcileError(EventDropError):
    pass


class ReconcileInvalid(ReconcileError):
    """Bad arguments: nothing was started."""


class ReconcileBusy(ReconcileError):
    """Another run of the same thing is in progress."""


class ReconcileFailed(ReconcileError):
    """The run cannot compare anything: credentials, permissions or configuration."""


class ReconcileStopped(ReconcileError):
    """The run stopped early; what it did so far stands."""
