"""The handler registry: which business functions receive which verified events.

Handlers are declared next to the code they belong to, in `<app>/handlers.py`, with the
decorator below; IngressConfig.ready() imports every such module, so the registry is
complete once Django is set up, and `manage.py list_handlers` prints it.

    @webhook_handler(provider="stripe", event_types=["checkout.session.completed"])
    def mark_recap_paid(event: RawEvent, payload: dict) -> None: ...

A handler runs once per *delivery* and may run more than once for the same event (retries,
replays, provider duplicates that slipped past dedup): it must be idempotent. Raise
PermanentHandlerError for input that will never succeed: the one verdict that ends a
delivery at once. Our own database failing under it (any DatabaseError: a lock or statement
timeout, a deadlock, a restart) is never charged to the delivery; any other exception may be
the handler's own bug on this event, and is retried with backoff, charged, until
DELIVERY_MAX_ATTEMPTS *and* DELIVERY_TRANSIENT_HORIZON_SECONDS (kernel/retry.py).

A handler may return a note, one line the console shows on the event's delivery, when what
it did is not the obvious (it ignored the event as stale, say); `None` otherwise.

Order is not assumed unless the handler asks for it, with an ordering key and, optionally,
the provider's own event time (dotted paths into the JSON payload):

    @webhook_handler(
        provider="stripe",
        event_types=["checkout.session.completed", "checkout.session.expired"],
        ordering_key="data.object.id",
        event_time="created",
    )

For one value of the key the inbox then never runs two of the handler's deliveries at once,
and never runs an older event (by event time, ties by received order; received order alone
without `event_time`) after a newer one was handled: the late older delivery is recorded
`superseded`, with the delivery it lost to, and can be replayed by force
(ingress/deliveries/). An event whose payload lacks the key is delivered unordered.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from ingress.payloads import storable_text
from kernel.errors import PermanentError, ServiceFailure

HandlerFunc = Callable[..., str | None]
# A handler's note is stored with its attempt (DeliveryAttempt.note), cut to this length.
NOTE_MAX_LENGTH = 500


class PermanentHandlerError(PermanentError):
    """The handler will never succeed on this event; do not retry it."""

    permanent_reason = "permanent_handler_error"


class DownstreamRateLimited(ServiceFailure):
    """The handler's downstream answered 429 (or asked for a pause with Retry-After): about
    its load, not this event. The delivery is released uncharged, and the handler's claims
    stop for the pause and run at half its rate for a while (ingress/deliveries/pace.py)."""

    def __init__(
        self, message: str = "downstream rate limited", *, retry_after: float | None = None
    ):
        super().__init__(message, error_class="downstream_rate_limited", retry_after=retry_after)


@dataclass(frozen=True)
class HandlerSpec:
    name: str  # dotted path, stored on Delivery.handler
    provider: str
    event_types: frozenset[str]  # "*" matches every event type of the provider
    func: HandlerFunc
    ordering_key: str = ""  # dotted path into the payload; "" = deliveries are unordered
    event_time: str = ""  # dotted path to the provider's event time; "" = received order
    # The downstream's limits, across every worker (ingress/deliveries/pace.py); settings'
    # HANDLER_LIMITS overrides them per environment. None: unlimited.
    rate: float | None = None  # deliveries started per second
    concurrency: int | None = None  # deliveries in flight at once
    replay_volume: int | None = None  # events a bulk replay must clear within its SLO

    def matches(self, provider: str, event_type: str) -> bool:
        return provider == self.provider and (
            "*" in self.event_types or event_type in self.event_types
        )

    @property
    def ordered(self) -> bool:
        return bool(self.ordering_key)

    def ordering_of(self, payload: object) -> tuple[str, datetime | None]:
        """This event's key value ("" when the payload has none) and provider event time
        (None when the handler declares none, or the payload's is missing or unreadable)."""
        key = payload_value(payload, self.ordering_key) if self.ordering_key else None
        if key is None or isinstance(key, dict | list) or key == "":
            return "", None
        moment = payload_value(payload, self.event_time) if self.event_time else None
        return str(key)[:ORDERING_KEY_MAX_LENGTH], event_time_from(moment)


# Delivery.ordering_key's column width; longer values are cut (two keys that share their
# first 255 characters are then ordered together: slower, never wrong).
ORDERING_KEY_MAX_LENGTH = 255


def payload_value(payload: object, path: str) -> object:
    """`a.b.c` looked up in nested JSON objects; None where any step is missing."""
    value = payload
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def event_time_from(value: object) -> datetime | None:
    """A provider's event time: Unix seconds (Stripe's `created`) or an ISO 8601 string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(value, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str):
        try:
            parsed = parse_datetime(value)
        except ValueError:
            return None
        if parsed is not None and parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed
    return None


_registry: dict[str, HandlerSpec] = {}


def webhook_handler(
    *,
    provider: str,
    event_types: Iterable[str],
    ordering_key: str | None = None,
    event_time: str | None = None,
    rate: float | None = None,
    concurrency: int | None = None,
    replay_volume: int | None = None,
) -> Callable[[HandlerFunc], HandlerFunc]:
    types = frozenset(event_types)
    check_limits(rate=rate, concurrency=concurrency, replay_volume=replay_volume)
    if not types:
        raise ValueError("a webhook handler needs at least one event type (or '*')")
    for label, path in (("ordering_key", ordering_key), ("event_time", event_time)):
        if path is not None and (not path or any(not part for part in path.split("."))):
            raise ValueError(f"{label} must be a dotted path into the payload, got {path!r}")
    if event_time and not ordering_key:
        raise ValueError("event_time orders the deliveries of one ordering_key: declare both")

    def register(func: HandlerFunc) -> HandlerFunc:
        name = f"{func.__module__}.{func.__qualname__}"
        _registry[name] = HandlerSpec(
            name=name,
            provider=provider,
            event_types=types,
            func=func,
            ordering_key=ordering_key or "",
            event_time=event_time or "",
            rate=rate,
            concurrency=concurrency,
            replay_volume=replay_volume,
        )
        return func

    return register


def check_limits(
    *, rate: object = None, concurrency: object = None, replay_volume: object = None
) -> None:
    """A handler's limits, where declared or overridden: a rate above 0, counts of 1 or more."""
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0
    ):
        raise ValueError(f"a handler's rate is deliveries per second above 0, got {rate!r}")
    for label, count in (("concurrency", concurrency), ("replay_volume", replay_volume)):
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 1
        ):
            raise ValueError(f"a handler's {label} is a whole number of 1 or more, got {count!r}")


def handler_note(result: object) -> str:
    """What a handler returned, as the note stored with its attempt ("" for None)."""
    if not result:
        return ""
    return storable_text(str(result))[:NOTE_MAX_LENGTH]


def handlers_for(provider: str, event_type: str) -> list[HandlerSpec]:
    return sorted(
        (spec for spec in _registry.values() if spec.matches(provider, event_type)),
        key=lambda spec: spec.name,
    )


def get_handler(name: str) -> HandlerSpec | None:
    return _registry.get(name)


def all_handlers() -> list[HandlerSpec]:
    return sorted(_registry.values(), key=lambda spec: (spec.provider, spec.name))


def unregister(name: str) -> Any:
    """For tests that register throw-away handlers."""
    return _registry.pop(name, None)
