"""The local fake Stripe (fakes/stripe.py, which lists Events) with the API key
checked and failure switches for the reconciliation tests.

    GET /v1/events   created[gte] / created[lt], types[n], limit, starting_after; newest
                     first, like Stripe. Bearer auth against `api_key`.

Failure switches: `forbidden` (403), `rate_limit_from_request` (429 from the n-th list
request on, counting from 1), `list_delay` (seconds before each list answer).
"""

from urllib.parse import parse_qsl, urlsplit

from fakes.stripe import FakeStripe, _Handler


class FakeStripeEvents(FakeStripe):
    def __init__(self, *, api_key: str):
        super().__init__()
        self.api_key = api_key
        self.list_requests: list[dict] = []
        self.forbidden = False
        self.rate_limit_from_request: int | None = None
        self.list_delay = 0.0
        self._server.RequestHandlerClass = _EventsHandler


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
