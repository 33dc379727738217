"""The handler registry: which business functions receive which verified events.

Handlers are declared next to the code they belong to, in `<app>/handlers.py`, with the
decorator below; IngressConfig.ready() imports every such module, so the registry is
complete once Django is set up, and `manage.py list_handlers` prints it.

    @webhook_handler(provider="stripe", event_types=["checkout.session.completed"])
    def mark_recap_paid(event: RawEvent, payload: dict) -> None: ...

A handler runs once per *delivery* and may run more than once for the same event (retries,
replays, provider duplicates that slipped past dedup): it must be idempotent and must not
assume ordering. Raise PermanentHandlerError for input that will never succeed; any other
exception is treated as transient and retried with backoff.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from eventdrop.errors import EventDropError

HandlerFunc = Callable[..., None]


class PermanentHandlerError(EventDropError):
    """The handler will never succeed on this event; do not retry it."""


@dataclass(frozen=True)
class HandlerSpec:
    name: str  # dotted path, stored on Delivery.handler
    provider: str
    event_types: frozenset[str]  # "*" matches every event type of the provider
    func: HandlerFunc

    def matches(self, provider: str, event_type: str) -> bool:
        return provider == self.provider and (
            "*" in self.event_types or event_type in self.event_types
        )


_registry: dict[str, HandlerSpec] = {}


def webhook_handler(
    *, provider: str, event_types: Iterable[str]
) -> Callable[[HandlerFunc], HandlerFunc]:
    types = frozenset(event_types)
    if not types:
        raise ValueError("a webhook handler needs at least one event type (or '*')")

    def register(func: HandlerFunc) -> HandlerFunc:
        name = f"{func.__module__}.{func.__qualname__}"
        _registry[name] = HandlerSpec(name=name, provider=provider, event_types=types, func=func)
        return func

    return register


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
