"""A fake of the part of Stripe a recap purchase uses: a real HTTP server on 127.0.0.1, for
`make run` (`manage.py run_fake_stripe`), `manage.py demo` and the tests.

    POST /v1/checkout/sessions  form-encoded, as the stripe SDK sends it; answers a session
                                object whose `url` is this server's checkout page. The same
                                Idempotency-Key gets the same session back.
    GET  /c/pay/<session id>    the checkout page: the amount and a "Pay" button
    POST /c/pay/<session id>    the buyer pays: the session becomes complete and paid, and a
                                `checkout.session.completed` event, signed exactly as Stripe
                                signs (the SDK's own signature code, `webhook_secret`), is
                                POSTed to `webhook_url` — our own ingress. A browser is sent on
                                to the session's success_url (303); `Accept: application/json`
                                answers {"event_id", "webhook_status"} instead. 409 when the
                                session is already paid, 404 when unknown.
    GET  /v1/events             the events it sent (and those added with `add_event`), as
                                Stripe lists them: created[gte] / created[lt], types[n],
                                limit, starting_after; newest first. So `manage.py
                                reconcile_stripe` under `make run` compares against them.

Modes for the tests (attribute `mode`): "ok", "hang" (the session answer after `delay`
seconds), "error_500". Event and payment ids are random, so a restarted fake never sends an
event id (our dedup key) or a payment reference (unique per recap) a second time.
"""

import contextlib
import html
import json
import logging
import threading
import time
import uuid
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import requests
import stripe

from fakes.local_service import LocalHTTPService

logger = logging.getLogger(__name__)

CHECKOUT_PATH = "/c/pay/"
_WEBHOOK_ATTEMPTS = 3
_WEBHOOK_TIMEOUT = (2, 5)  # connect, read: a stuck ingress costs at most 3 x 7 s + waits


class FakeStripe(LocalHTTPService):
    def __init__(self, *, port: int = 0, webhook_url: str = "", webhook_secret: str = ""):
        if "," in webhook_secret:
            # STRIPE_WEBHOOK_SECRET lists several secrets during a rotation; Stripe signs
            # with one of them (the current one), never with the list.
            raise ValueError("sign with one secret, not a comma-separated list")
        super().__init__(_Handler, port)
        self.webhook_url = webhook_url
        self.webhook_secret = webhook_secret
        self.mode = "ok"
        self.delay = 2.0
        self.requests: list[dict] = []
        self.sessions: dict[str, dict] = {}  # by idempotency key
        # (event id, our ingress's HTTP status or None when it could not be reached)
        self.webhooks_sent: list[tuple[str, int | None]] = []
        self.events: list[dict] = []  # what GET /v1/events lists
        self.list_lock = threading.Lock()
        self.lock = threading.Lock()

    # --- behaviour ---------------------------------------------------------------------------

    def create_session(self, form: dict[str, str], key: str) -> dict:
        with self.lock:
            session = self.sessions.get(key)
            if session is None:
                number = len(self.sessions) + 1
                session_id = f"cs_test_{number}"
                session = {
                    "id": session_id,
                    "object": "checkout.session",
                    "mode": form.get("mode"),
                    "status": "open",
                    "payment_status": "unpaid",
                    "payment_intent": None,
                    "amount_total": int(form.get("line_items[0][price_data][unit_amount]") or 0),
                    "currency": form.get("line_items[0][price_data][currency]"),
                    "client_reference_id": form.get("client_reference_id"),
                    "metadata": {
                        k[len("metadata[") : -1]: v
                        for k, v in form.items()
                        if k.startswith("metadata[")
                    },
                    "success_url": form.get("success_url"),
                    "cancel_url": form.get("cancel_url"),
                    "url": f"{self.url}{CHECKOUT_PATH}{session_id}",
                }
                self.sessions[key] = session
            return session

    def add_event(
        self, event_type: str, *, created: datetime | None = None, data: dict | None = None
    ) -> dict:
        """An event Stripe knows about (listed by GET /v1/events), whether sent or not."""
        event_id = f"evt_fake_{uuid.uuid4().hex[:24]}"
        event = {
            "id": event_id,
            "object": "event",
            "api_version": stripe.api_version,
            "created": int(created.timestamp() if created else time.time()),
            "data": {"object": data or {"id": f"obj_{event_id[9:]}", "object": "thing"}},
            "livemode": False,
            "pending_webhooks": 1,
            "request": {"id": None, "idempotency_key": None},
            "type": event_type,
        }
        with self.list_lock:
            self.events.append(event)
        return event

    def listing(self, query: dict[str, str]) -> tuple[list[dict], bool]:
        """One page of GET /v1/events: (events, has_more)."""
        gte = int(query.get("created[gte]", 0))
        lt = int(query.get("created[lt]", 2**62))
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
            position = next((i for i, e in enumerate(matching) if e["id"] == after), -1)
            matching = matching[position + 1 :]
        limit = int(query.get("limit", 10))
        return matching[:limit], len(matching) > limit

    def session_by_id(self, session_id: str) -> dict | None:
        with self.lock:
            return next((s for s in self.sessions.values() if s["id"] == session_id), None)

    def complete(self, session_id: str) -> tuple[int, dict[str, Any]]:
        """The buyer paid: (HTTP status for the payer, what happened)."""
        with self.lock:
            session = next((s for s in self.sessions.values() if s["id"] == session_id), None)
            if session is None:
                return 404, {"error": "no such checkout session"}
            if session["payment_status"] == "paid":
                return 409, {"error": "this checkout session is already paid"}
            if not (self.webhook_url and self.webhook_secret):
                return 409, {"error": "the fake Stripe has no webhook_url / webhook_secret"}
            session.update(
                status="complete",
                payment_status="paid",
                payment_intent=f"pi_fake_{uuid.uuid4().hex[:24]}",
            )
            paid_session = dict(session)
        event = self.add_event("checkout.session.completed", data=paid_session)
        status = self.send_webhook(event)
        return 200, {"event_id": event["id"], "webhook_status": status, "session": session}

    def send_webhook(self, event: dict) -> int | None:
        """POST the event to our ingress, signed; a few attempts on no answer or a 5xx (Stripe
        itself retries for days — here the payer is waiting)."""
        body = json.dumps(event)
        status: int | None = None
        for attempt in range(1, _WEBHOOK_ATTEMPTS + 1):
            if self.stopping.is_set():
                break
            signature = stripe.WebhookSignature.generate_signature_header(
                body, self.webhook_secret
            )
            try:
                response = requests.post(
                    self.webhook_url,
                    data=body.encode(),
                    headers={"Content-Type": "application/json", "Stripe-Signature": signature},
                    timeout=_WEBHOOK_TIMEOUT,
                )
                status = response.status_code
            except requests.RequestException as exc:
                logger.warning(
                    "fake_stripe.webhook_failed",
                    extra={"attempt": attempt, "error_class": type(exc).__name__},
                )
                status = None
            if status is not None and status < 500:
                break
            self.stopping.wait(0.5 * attempt)
        with self.lock:
            self.webhooks_sent.append((event["id"], status))
        return status


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeStripe/1.0"

    @property
    def fake(self) -> FakeStripe:
        return self.server.fake  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("fake_stripe.request " + format, *args)

    def _send(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Request-Id", "req_fake")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        with contextlib.suppress(OSError):  # the caller gave up (timeout tests)
            self.wfile.write(body)

    def _json(self, status: int, data: dict) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def _form(self) -> dict[str, str]:
        length = int(self.headers.get("Content-Length") or 0)
        return dict(parse_qsl(self.rfile.read(min(length, 1024 * 1024)).decode()))

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/v1/events":
            page, has_more = self.fake.listing(dict(parse_qsl(url.query)))
            self._json(
                200, {"object": "list", "url": "/v1/events", "has_more": has_more, "data": page}
            )
        elif self.path.startswith(CHECKOUT_PATH):
            self._checkout_page(self.path.removeprefix(CHECKOUT_PATH))
        elif self.path == "/":
            self._send(200, b"fake Stripe: POST /v1/checkout/sessions, /c/pay/<id>\n", "text/plain")
        else:
            self._json(404, {"error": {"type": "invalid_request_error", "message": "no"}})

    def do_POST(self) -> None:
        fake = self.fake
        if self.path.startswith(CHECKOUT_PATH):
            self._pay(self.path.removeprefix(CHECKOUT_PATH))
            return
        form = self._form()
        key = self.headers.get("Idempotency-Key", "")
        with fake.lock:
            fake.requests.append(
                {
                    "path": self.path,
                    "form": form,
                    "authorization": self.headers.get("Authorization", ""),
                    "idempotency_key": key,
                }
            )
        if self.path != "/v1/checkout/sessions":
            self._json(404, {"error": {"type": "invalid_request_error", "message": "no"}})
            return
        if fake.mode == "hang":
            fake.stopping.wait(fake.delay)
        if fake.mode == "error_500":
            self._json(500, {"error": {"type": "api_error", "message": "boom"}})
            return
        self._json(200, fake.create_session(form, key))

    def _checkout_page(self, session_id: str) -> None:
        session = self.fake.session_by_id(session_id)
        if session is None:
            self._send(404, b"no such checkout session\n", "text/plain")
            return
        amount = f"{session['amount_total'] / 100:.2f} {(session['currency'] or '').upper()}"
        paid = session["payment_status"] == "paid"
        page = (
            "<!doctype html><title>Fake Stripe checkout</title>"
            f"<h1>Fake Stripe checkout {html.escape(session_id)}</h1>"
            f"<p>Recap {html.escape(str(session['metadata'].get('recap_id', '')))}: "
            f"{html.escape(amount)}</p>"
            + (
                "<p>Paid.</p>"
                if paid
                else f'<form method="post" action="{CHECKOUT_PATH}{html.escape(session_id)}">'
                '<button type="submit">Pay (test mode)</button></form>'
            )
        )
        self._send(200, page.encode(), "text/html; charset=utf-8")

    def _pay(self, session_id: str) -> None:
        status, result = self.fake.complete(session_id)
        wants_json = "application/json" in self.headers.get("Accept", "")
        if status != 200 or wants_json:
            self._json(status, {k: v for k, v in result.items() if k != "session"})
            return
        target = result["session"].get("success_url") or "/"
        self._send(303, b"", "text/plain", Location=target)
