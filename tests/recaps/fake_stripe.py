"""A local fake of the one Stripe endpoint we call, for the real stripe SDK to talk to.

    POST /v1/checkout/sessions   form-encoded, as the SDK sends it; answers a session object.
                                 The same Idempotency-Key gets the same session back.
Modes: "ok", "hang" (answer after `delay` seconds), "error_500".
"""

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl


class FakeStripe:
    def __init__(self):
        self.mode = "ok"
        self.delay = 2.0
        self.requests: list[dict] = []
        self.sessions: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeStripe":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format, *args):
        return None

    def _json(self, status: int, data: dict) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Request-Id", "req_fake")
        self.end_headers()
        with contextlib.suppress(OSError):  # the SDK gave up (timeout tests)
            self.wfile.write(body)

    def do_POST(self) -> None:
        fake: FakeStripe = self.server.fake  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        form = dict(parse_qsl(self.rfile.read(length).decode()))
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
        with fake.lock:
            session = fake.sessions.get(key)
            if session is None:
                number = len(fake.sessions) + 1
                session = {
                    "id": f"cs_test_{number}",
                    "object": "checkout.session",
                    "mode": form.get("mode"),
                    "status": "open",
                    "payment_status": "unpaid",
                    "client_reference_id": form.get("client_reference_id"),
                    "metadata": {
                        k[len("metadata[") : -1]: v
                        for k, v in form.items()
                        if k.startswith("metadata[")
                    },
                    "url": f"https://checkout.stripe.test/c/pay/cs_test_{number}",
                }
                fake.sessions[key] = session
        self._json(200, session)
