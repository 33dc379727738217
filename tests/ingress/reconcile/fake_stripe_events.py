"""The recaps' fake Stripe (recaps/fake_stripe.py) taught to list Events.

    GET /v1/events   created[gte] / created[lt], types[n], limit, starting_after; newest
                     first, like Stripe. Bearer auth against `api_key`.

Failure switches: `forbidden` (403), `rate_limit_from_request` (429 from the n-th list
request on, counting from 1), `list_delay` (seconds before each list answer).
"""

import itertools
import threading
from datetime import datetime
from urllib.parse import parse_qsl, urlsplit

from recaps.fake_stripe import FakeStripe, _Handler

_numbers = itertools.count(1)


class FakeStripeEvents(FakeStripe):
    def __init__(self, *, api_key: str):
        super().__init__()
        self.api_key = api_key
        self.events: list[dict] = []
        self.list_requests: list[dict] = []
        self.forbidden = False
        self.rate_limit_from_request: int | None = None
        self.list_delay = 0.0
        self.list_lock = threading.Lock()
        self._server.RequestHandlerClass = _EventsHandler

    def add_event(self, event_type: str, *, created: datetime, data: dict | None = None) -> dict:
        number = next(_numbers)
        event = {
            "id": f"evt_test_{number:06d}",
            "object": "event",
            "api_version": "2026-10-28.endive",
            "created": int(created.timestamp()),
            "data": {"object": data or {"id": f"obj_{number}", "object": "thing"}},
            "livemode": False,
            "pending_webhooks": 1,
            "request": {"id": None, "idempotency_key": None},
            "type": event_type,
        }
        with self.list_lock:
            self.events.append(event)
        return event

    def listing(self, query: dict[str, str]) -> tuple[list[dict], bool]:
        gte, lt = int(query["created[gte]"]), int(query["created[lt]"])
        types = {value for key, value in query.items() if key.startswith("types[")}
        with self.list_lock:
            matching = sorted(
                (
                    e
                    for e in self.events
                    if gte <= e["created"] < lt and (not types or e["type"] in types)
                ),
                key=lambda e: (e["created"], e["id"]),
                reverse=True,
            )
        after = query.get("starting_after")
        if after:
            position = next(i for i, e in enumerate(matching) if e["id"] == after)
            matching = matching[position + 1 :]
        limit = int(query.get("limit", 10))
        return matching[:limit], len(matching) > limit


class _EventsHandler(_Handler):
    def do_GET(self) -> None:
        fake: FakeStripeEvents = self.server.fake  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query))
        with fake.list_lock:
            fake.list_requests.append(
                {"path": url.path, "query": query, "authorization": self.headers["Authorization"]}
            )
            count = len(fake.list_requests)
        if fake.list_delay:
            fake.stopping.wait(fake.list_delay)
        if url.path != "/v1/events":
            self._json(404, {"error": {"type": "invalid_request_error", "message": "no"}})
        elif self.headers.get("Authorization") != f"Bearer {fake.api_key}":
            self._json(
                401,
                {
                    "error": {
                        "type": "invalid_request_error",
                        "message": "Invalid API Key provided: sk_test_****oops",
                    }
                },
            )
        elif fake.forbidden:
            self._json(
                403,
                {
                    "error": {
                        "type": "invalid_request_error",
                        "message": "The provided key does not have the required permissions.",
                    }
                },
            )
        elif fake.rate_limit_from_request is not None and count >= fake.rate_limit_from_request:
            self._json(
                429,
                {
                    "error": {
                        "type": "invalid_request_error",
                        "code": "rate_limit",
                        "message": "Too many requests hit the API too quickly.",
                    }
                },
            )
        else:
            page, has_more = fake.listing(query)
            self._json(
                200, {"object": "list", "url": "/v1/events", "has_more": has_more, "data": page}
            )
