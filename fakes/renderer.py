"""A fake render service: a real HTTP server on 127.0.0.1, for local runs and tests.

    GET  /health      200 {"status": "ok"} (503 when unhealthy)
    POST /renders     202 {"render_id", "status": "accepted"}; the same Idempotency-Key again
                      → 200 with the same render_id and "replayed": true, never a second render
    GET  /renders/<id> 200 {"render_id", "idempotency_key", "recap_id", "status":
                      "rendering"|"completed"|"failed", "video_url" | "error"}; 404 if unknown.
                      A render is `rendering` until `complete_after` has passed, then has the
                      outcome it was accepted with, whether or not its callback got through
    POST /_control    {"mode": "...", "delay": s, "retry_after": s, "drip_interval": s,
                       "outcome": "completed"|"failed", "complete_after": s, "callbacks": bool,
                       "status": 3xx-5xx (for mode `answer`), "restart": true}
    GET  /_stats      counters (renders, POSTs per idempotency key, health checks, callbacks)

`restart` is a restart of a service that keeps its renders in memory: every render (and
every callback not sent yet) is forgotten, so GET /renders/<id> answers 404 for renders it
accepted before, and the same Idempotency-Key is accepted anew as a new render. The test
counters (`posts_by_key`, `accepted`, …) survive it; `accepted` lists every render ever
accepted, across restarts.

After accepting a render it POSTs the completion to the request's callback_url, signed
with the `renderer` secret through the `standardwebhooks` library (the payload is the one
outbox/handlers.py documents), echoing the render request's W3C `traceparent` header;
`callbacks: false` drops every callback (a lost completion, which GET /renders/<id> still
answers). Failure modes, switchable at runtime, apply to POST /renders and GET /renders/<id>
alike (error_4xx to POST only):

    ok            everything works
    down          every request except /_control is dropped without an answer
    unhealthy     /health and /renders answer 503
    slow          /renders accepts the render, then answers after `delay` (an ambiguous
                  timeout for a caller with a shorter read timeout)
    error_5xx     /renders answers 500
    error_4xx     /renders answers 422
    hang          /renders never answers; the connection is released when the caller's
                  X-Request-Deadline-Ms has passed (the deadline is honoured) or after `delay`
    drip          /renders accepts, then sends its answer one byte per `drip_interval`
    rate_limited  /renders answers 429 with Retry-After: `retry_after`
    answer        /renders answers `status`, as a deploy in progress does while /health stays
                  green: 404 (an ingress's default backend), 409 (the Idempotency-Key draft's
                  "the first request with this key is still in flight"), 307 (a redirect to a
                  maintenance page, with a Location header), or any other 3xx-5xx

Every wait is bounded and ends early when the server stops.
"""

import json
import logging
import threading
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

import requests
from opentelemetry.trace import SpanKind
from standardwebhooks.webhooks import Webhook

from fakes.local_service import LocalHTTPService
from kernel import tracing

logger = logging.getLogger(__name__)

MODES = (
    "ok",
    "down",
    "unhealthy",
    "slow",
    "error_5xx",
    "error_4xx",
    "hang",
    "drip",
    "rate_limited",
    "answer",
)
_MAX_WAIT_SECONDS = 60.0
_CALLBACK_ATTEMPTS = 3


@dataclass
class FakeRender:
    render_id: str
    idempotency_key: str
    recap_id: str
    callback_url: str
    photos: int
    created_at: datetime
    # Fixed when the render is accepted: what its callback and its status will say.
    outcome: str = "completed"
    complete_after: float = 0.0
    # The W3C traceparent the render request carried: echoed on its callback, as a real
    # render service must (docs/tracing.md).
    traceparent: str = ""

    def state(self, now: datetime) -> str:
        if (now - self.created_at).total_seconds() < self.complete_after:
            return "rendering"
        return self.outcome


class FakeRenderer(LocalHTTPService):
    def __init__(
        self,
        *,
        secret: str,
        port: int = 0,
        complete_after: float = 0.05,
        callbacks: bool = True,
        video_base_url: str = "https://videos.eventdrop.invalid",
    ):
        if "," in secret:
            # RENDERER_WEBHOOK_SECRET lists several secrets during a rotation; a sender signs
            # with one of them (the current one), never with the list.
            raise ValueError("sign with one secret, not a comma-separated list")
        self.secret = secret
        self.video_base_url = video_base_url.rstrip("/")
        super().__init__(_Handler, port)
        self.lock = threading.Lock()
        self.mode = "ok"
        self.delay = 5.0
        self.drip_interval = 0.2
        self.retry_after = 30
        self.outcome = "completed"
        self.complete_after = complete_after
        self.callbacks = callbacks
        self.answer_status = 404
        self.renders: dict[str, FakeRender] = {}
        # Every render ever accepted, in order, across restarts.
        self.accepted: list[FakeRender] = []
        self.posts_by_key: Counter[str] = Counter()
        # GET /renders/<id> per render id (the lost-callback recovery asks these).
        self.status_requests: Counter[str] = Counter()
        self.deadlines_ms: list[int] = []
        self.health_checks = 0
        # POST /renders being answered right now, and the most ever at once (bulkhead tests).
        self.in_flight = 0
        self.max_in_flight = 0
        self.callbacks_sent: list[tuple[str, str, int | None]] = []
        self._timers: list[threading.Timer] = []

    # --- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        # Pending callbacks are cancelled, not sent into a server that is going away.
        self.stopping.set()
        self._cancel_callbacks()
        super().stop()

    def restart(self) -> None:
        """A restart that loses the service's memory: every render and pending callback."""
        self._cancel_callbacks()
        with self.lock:
            self.renders.clear()
        logger.info("fake_renderer.restarted")

    def _cancel_callbacks(self) -> None:
        with self.lock:
            timers, self._timers = self._timers, []
        for timer in timers:
            timer.cancel()

    # --- control -----------------------------------------------------------------------------

    def configure(self, **options: Any) -> None:
        mode = options.get("mode", self.mode)
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        with self.lock:
            self.mode = mode
            for name in ("delay", "drip_interval", "complete_after"):
                if name in options:
                    setattr(self, name, min(float(options[name]), _MAX_WAIT_SECONDS))
            if "retry_after" in options:
                self.retry_after = int(options["retry_after"])
            if "outcome" in options:
                self.outcome = "failed" if options["outcome"] == "failed" else "completed"
            if "callbacks" in options:
                self.callbacks = bool(options["callbacks"])
            if "status" in options:
                status = int(options["status"])
                if not 300 <= status < 600:
                    raise ValueError(f"status {status}: an answer mode answers 3xx to 5xx")
                self.answer_status = status
        if options.get("restart"):
            self.restart()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "mode": self.mode,
                "renders": len(self.renders),
                "accepted": len(self.accepted),
                "posts_by_key": dict(self.posts_by_key),
                "status_requests": dict(self.status_requests),
                "health_checks": self.health_checks,
                "max_in_flight": self.max_in_flight,
                "callbacks_sent": len(self.callbacks_sent),
            }

    def renders_for_recap(self, recap_id: str) -> list[FakeRender]:
        with self.lock:
            return [r for r in self.renders.values() if r.recap_id == recap_id]

    # --- behaviour ---------------------------------------------------------------------------

    def accept(self, key: str, body: dict, traceparent: str = "") -> tuple[FakeRender, bool]:
        """Register the render for `key` once; (render, replayed)."""
        with self.lock:
            existing = self.renders.get(key)
            if existing is not None:
                return existing, True
            render = FakeRender(
                render_id=f"rnd_{uuid.uuid4().hex[:16]}",
                idempotency_key=key,
                recap_id=str(body.get("recap_id", "")),
                callback_url=str(body.get("callback_url", "")),
                photos=len(body.get("photos") or []),
                created_at=datetime.now(tz=UTC),
                outcome=self.outcome,
                complete_after=self.complete_after,
                traceparent=traceparent,
            )
            self.renders[key] = render
            self.accepted.append(render)
            if self.callbacks and render.callback_url:
                timer = threading.Timer(self.complete_after, self._send_callback, (render,))
                timer.daemon = True
                self._timers.append(timer)
                timer.start()
        return render, False

    def render_for_id(self, render_id: str) -> FakeRender | None:
        with self.lock:
            return next((r for r in self.renders.values() if r.render_id == render_id), None)

    def render_data(self, render: FakeRender, outcome: str) -> dict[str, Any]:
        """What the service says about a render: in its callback and at GET /renders/<id>."""
        data: dict[str, Any] = {
            "recap_id": render.recap_id,
            "render_id": render.render_id,
            "idempotency_key": render.idempotency_key,
        }
        if outcome == "completed":
            data["video_url"] = f"{self.video_base_url}/{render.render_id}.mp4"
        elif outcome == "failed":
            data["error"] = {"code": "photos_unreadable", "message": "no photo could be decoded"}
        return data

    def callback_body(self, render: FakeRender, outcome: str) -> dict:
        data = self.render_data(render, outcome)
        return {
            "type": f"render.{outcome}",
            "timestamp": datetime.now(tz=UTC).isoformat(),
            "data": data,
        }

    def signed_callback(self, render: FakeRender, outcome: str) -> tuple[bytes, dict[str, str]]:
        body = json.dumps(self.callback_body(render, outcome)).encode()
        # Stable per render and outcome: a retried callback is the same message (dedup).
        msg_id = f"msg_{render.render_id}_{outcome}"
        signature = Webhook(self.secret).sign(msg_id, datetime.now(tz=UTC), body.decode())
        now = int(datetime.now(tz=UTC).timestamp())
        return body, {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(now),
            "webhook-signature": signature,
        }

    def _send_callback(self, render: FakeRender) -> None:
        outcome = render.outcome
        for attempt in range(1, _CALLBACK_ATTEMPTS + 1):
            if self.stopping.is_set():
                return
            body, headers = self.signed_callback(render, outcome)
            if render.traceparent:
                headers["traceparent"] = render.traceparent
            status: int | None = None
            try:
                # Traced, its client span is the render's child, and requests' instrumentation
                # sends that one's traceparent instead: the same trace either way.
                with tracing.span("fake render callback", parent=render.traceparent):
                    response = requests.post(
                        render.callback_url, data=body, headers=headers, timeout=(2, 5)
                    )
                status = response.status_code
            except requests.RequestException:
                logger.warning("fake_renderer.callback_failed", extra={"attempt": attempt})
            with self.lock:
                self.callbacks_sent.append((render.render_id, outcome, status))
            if status is not None and status < 500:
                return
            self.stopping.wait(0.2 * attempt)


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeRenderer/1.0"

    @property
    def fake(self) -> FakeRenderer:
        return self.server.fake  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("fake_renderer.request " + format, *args)

    def _json(self, status: int, data: dict, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self._write(body)

    def _write(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:  # the caller gave up and closed the connection
            return False

    def _drop(self) -> None:
        self.close_connection = True

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(min(length, 1024 * 1024)) if length else b""
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def do_GET(self) -> None:
        fake = self.fake
        if self.path == "/_stats":
            self._json(200, fake.stats())
            return
        if fake.mode == "down":
            self._drop()
            return
        if self.path == "/health":
            with fake.lock:
                fake.health_checks += 1
            if fake.mode == "unhealthy":
                self._json(503, {"status": "unavailable"})
            else:
                self._json(200, {"status": "ok"})
            return
        if self.path.startswith("/renders/"):
            self._status(self.path.removeprefix("/renders/"))
            return
        self._json(404, {"error": "not_found"})

    def do_POST(self) -> None:
        fake = self.fake
        if self.path == "/_control":
            try:
                fake.configure(**self._body())
            except (TypeError, ValueError) as exc:
                self._json(400, {"error": str(exc)})
                return
            self._json(200, fake.stats())
            return
        if fake.mode == "down":
            self._drop()
            return
        if self.path != "/renders":
            self._json(404, {"error": "not_found"})
            return
        with fake.lock:
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        try:
            self._render()
        finally:
            with fake.lock:
                fake.in_flight -= 1

    def _status(self, render_id: str) -> None:
        fake = self.fake
        deadline_ms = self.headers.get("X-Request-Deadline-Ms", "")
        with fake.lock:
            fake.status_requests[render_id] += 1
            if deadline_ms.isdigit():
                fake.deadlines_ms.append(int(deadline_ms))
        if self._failure_answer(fake.mode, deadline_ms):
            return
        render = fake.render_for_id(render_id)
        if render is None:
            self._json(404, {"error": "not_found"})
            return
        state = render.state(datetime.now(tz=UTC))
        answer = {**fake.render_data(render, state), "status": state}
        if fake.mode == "slow":
            fake.stopping.wait(fake.delay)
        if fake.mode == "drip":
            self._drip(200, answer)
        else:
            self._json(200, answer)

    def _failure_answer(self, mode: str, deadline_ms: str) -> bool:
        """Answer as the failure mode says, if it says anything; True when it did."""
        fake = self.fake
        if mode == "unhealthy":
            self._json(503, {"error": "unavailable"})
        elif mode == "error_5xx":
            self._json(500, {"error": "internal"})
        elif mode == "rate_limited":
            self._json(429, {"error": "slow_down"}, {"Retry-After": str(fake.retry_after)})
        elif mode == "answer":
            status = fake.answer_status
            headers = {"Location": "/maintenance"} if 300 <= status < 400 else {}
            self._json(status, {"error": "deploying"}, headers)
        elif mode == "hang":
            # Honour the caller's deadline: there is no point holding a connection (or doing
            # work) for a caller that has already given up.
            wait = int(deadline_ms) / 1000 if deadline_ms.isdigit() else fake.delay
            fake.stopping.wait(min(wait, fake.delay, _MAX_WAIT_SECONDS))
            self._drop()
        else:
            return False
        return True

    def _render(self) -> None:
        fake = self.fake
        body = self._body()
        key = self.headers.get("Idempotency-Key", "")
        deadline_ms = self.headers.get("X-Request-Deadline-Ms", "")
        with fake.lock:
            fake.posts_by_key[key] += 1
            if deadline_ms.isdigit():
                fake.deadlines_ms.append(int(deadline_ms))
        mode = fake.mode
        if not key:
            self._json(400, {"error": "idempotency_key_required"})
        elif mode == "error_4xx":
            self._json(422, {"error": "unprocessable"})
        elif self._failure_answer(mode, deadline_ms):
            pass
        else:
            traceparent = self.headers.get("traceparent", "")
            with tracing.span(
                "fake render accept",
                headers={"traceparent": traceparent},
                kind=SpanKind.SERVER,
                attributes={"eventdrop.idempotency_key": key},
            ):
                render, replayed = fake.accept(key, body, traceparent)
            answer = {"render_id": render.render_id, "status": "accepted", "replayed": replayed}
            if mode == "slow":
                fake.stopping.wait(fake.delay)
            if mode == "drip":
                self._drip(202 if not replayed else 200, answer)
            else:
                self._json(202 if not replayed else 200, answer)

    def _drip(self, status: int, data: dict) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.flush()
        except OSError:
            return
        for index in range(len(body)):
            if self.fake.stopping.wait(self.fake.drip_interval):
                return
            if not self._write(body[index : index + 1]):
                return
