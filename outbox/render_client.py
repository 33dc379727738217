"""The HTTP client for the render service: the render request (after a health precheck on the
breaker's half-open probe); and
the status of a render whose completion callback never arrived (GET /renders/<id>).

Every call has three limits (CallLimits): a connect timeout, a read timeout (the longest
silence between two bytes) and a total deadline. `requests` alone only has the first two,
and a read timeout does not cap a server that drips one byte every few seconds, so the body
is streamed and the socket's timeout is shortened to what is left before every read: a call
never outlives its deadline by more than one scheduler tick. (What it cannot cap is a server
that drips its *headers*; `requests` reads those before handing over. Our render service
sends small JSON answers in one write, so the read timeout bounds that phase in practice.)

The render request carries
- `Idempotency-Key`: derived from the outbox row and stable across retries, so a retry after
  an ambiguous timeout (the service got the request, we never saw the answer) returns the
  render already started instead of starting a second one;
- `X-Request-Deadline-Ms`: what is left of this call's deadline, so the service can stop
  working on a request whose caller has already given up (gRPC-style deadline propagation).

The worst case of one dispatch is computed from these limits in kernel/budgets.py, and a
system check holds it against the budget of every caller.
"""

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import requests
from django.conf import settings
from urllib3 import exceptions as urllib3_exceptions
from urllib3.util import Timeout

from kernel import tracing
from kernel.errors import Disposition
from kernel.retry import RetryPolicy, classify, parse_retry_after
from outbox.errors import (
    RenderBadResponse,
    RenderConnectionFailed,
    RenderDeadlineExceeded,
    RenderError,
    RenderHTTPError,
    RenderNotConfigured,
    RenderTimedOut,
    RenderUnhealthy,
)

logger = logging.getLogger(__name__)

DEADLINE_HEADER = "X-Request-Deadline-Ms"
IDEMPOTENCY_HEADER = "Idempotency-Key"
# Answers are a few hundred bytes of JSON; anything far larger is not our render service.
_MAX_BODY_BYTES = 64 * 1024
_CHUNK = 4096


@dataclass(frozen=True)
class CallLimits:
    connect: float
    read: float
    total: float

    def __post_init__(self) -> None:
        if min(self.connect, self.read, self.total) <= 0:
            raise ValueError(f"call limits must be positive: {self}")


@dataclass(frozen=True)
class RenderClientConfig:
    base_url: str
    callback_url: str
    health: CallLimits
    render: CallLimits
    # GET /renders/<id>: asking about a render whose completion callback never arrived.
    status: CallLimits
    # Render requests per dispatch (1 = no in-call retry; the outbox retries across runs).
    attempts: int
    # Pauses between those in-call attempts (unused when attempts == 1).
    backoff: RetryPolicy

    @classmethod
    def from_settings(cls) -> "RenderClientConfig":
        return cls(
            base_url=settings.RENDER_SERVICE_URL.rstrip("/"),
            callback_url=settings.RENDER_CALLBACK_URL,
            health=CallLimits(
                connect=settings.RENDER_HEALTH_CONNECT_TIMEOUT_SECONDS,
                read=settings.RENDER_HEALTH_READ_TIMEOUT_SECONDS,
                total=settings.RENDER_HEALTH_TIMEOUT_SECONDS,
            ),
            render=CallLimits(
                connect=settings.RENDER_CONNECT_TIMEOUT_SECONDS,
                read=settings.RENDER_READ_TIMEOUT_SECONDS,
                total=settings.RENDER_TIMEOUT_SECONDS,
            ),
            status=CallLimits(
                connect=settings.RENDER_STATUS_CONNECT_TIMEOUT_SECONDS,
                read=settings.RENDER_STATUS_READ_TIMEOUT_SECONDS,
                total=settings.RENDER_STATUS_TIMEOUT_SECONDS,
            ),
            attempts=settings.RENDER_CALL_ATTEMPTS,
            backoff=RetryPolicy(
                max_attempts=settings.RENDER_CALL_ATTEMPTS,
                base_seconds=settings.RENDER_CALL_BACKOFF_BASE_SECONDS,
                cap_seconds=settings.RENDER_CALL_BACKOFF_CAP_SECONDS,
            ),
        )

    def require_configured(self) -> None:
        if not self.base_url:
            raise RenderNotConfigured(setting="RENDER_SERVICE_URL")
        if not self.callback_url:
            raise RenderNotConfigured(setting="RENDER_CALLBACK_URL")


@dataclass(frozen=True)
class RenderAccepted:
    render_id: str
    # The service already knew the idempotency key (a retry of an accepted request).
    replayed: bool


RENDER_STATES = ("rendering", "completed", "failed")


@dataclass(frozen=True)
class RenderStatus:
    """The render service's answer to GET /renders/<id>."""

    render_id: str
    state: str  # one of RENDER_STATES
    video_url: str = ""
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class RenderClient:
    def __init__(
        self,
        config: RenderClientConfig,
        *,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ):
        self.config = config
        self._session = session or requests.Session()
        self._clock = clock
        self._sleep = sleep
        self._rng = rng

    def close(self) -> None:
        self._session.close()

    # --- the operation the dispatcher performs --------------------------------------------

    def request_render(
        self,
        *,
        idempotency_key: str,
        body: dict[str, Any],
        deadline: float,
        precheck: bool = True,
    ) -> RenderAccepted:
        """Health precheck (if `precheck`), then the render request (tried `attempts` times
        at most).

        The dispatcher asks for the precheck only on the half-open probe: while the breaker
        is closed the render request itself is the evidence, and a health call per row only
        halved the throughput. On the probe, a service that says it is unhealthy (draining,
        overloaded) is not sent the first render after an outage.

        `deadline` is a time.monotonic() value: nothing here runs past it, whatever the
        configured limits say, because the caller's budget is the one that counts.
        """
        self.config.require_configured()
        if precheck:
            self.check_health(deadline=deadline)
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._post_render(idempotency_key, body, deadline)
            except RenderError as exc:
                verdict = classify(exc)
                final = verdict.disposition == Disposition.PERMANENT or verdict.ambiguous
                if final or self.config.backoff.gives_up_after(attempt):
                    raise
                pause = self.config.backoff.delay(
                    attempt, retry_after=verdict.retry_after, rng=self._rng
                )
                if self._clock() + pause >= deadline:
                    raise
                logger.info(
                    "outbox.render_client.retry",
                    extra={"idempotency_key": idempotency_key, "attempt": attempt},
                )
                self._sleep(pause)

    # --- asking about a render whose completion callback never arrived ------------------------

    def render_status(self, *, render_id: str, deadline: float) -> RenderStatus:
        """GET /renders/<id>: one bounded call (the `status` limits, within `deadline`), no
        health precheck and no in-call retry. The retry loop is the render checks' interval
        (outbox/render_status.py), as the outbox is the render request's."""
        self.config.require_configured()
        answer = self._call(
            "GET", f"/renders/{quote(render_id, safe='')}", self.config.status, deadline
        )
        if not 200 <= answer.status < 300:
            raise RenderHTTPError(
                status=answer.status,
                retry_after=parse_retry_after(answer.headers.get("retry-after")),
            )
        try:
            data = json.loads(answer.body)
            state = str(data["status"])
            error = data.get("error") or {}
            status = RenderStatus(
                render_id=str(data.get("render_id") or render_id),
                state=state,
                video_url=str(data.get("video_url") or ""),
                error_code=str(error.get("code") or ""),
                error_message=str(error.get("message") or ""),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RenderBadResponse() from exc
        # An answer we cannot act on is not evidence about the render: never a verdict.
        if state not in RENDER_STATES or (state == "completed" and not status.video_url):
            raise RenderBadResponse()
        if status.render_id != render_id:
            raise RenderBadResponse()
        return status

    def check_health(self, *, deadline: float) -> None:
        answer = self._call("GET", "/health", self.config.health, deadline)
        if not 200 <= answer.status < 300:
            raise RenderUnhealthy(status=answer.status)

    def _post_render(self, key: str, body: dict[str, Any], deadline: float) -> RenderAccepted:
        payload = {**body, "callback_url": self.config.callback_url, "idempotency_key": key}
        headers = {IDEMPOTENCY_HEADER: key, "Content-Type": "application/json"}
        # W3C `traceparent`: the service sends it back on its callback, which so joins the
        # recap's trace (docs/tracing.md). requests' instrumentation puts its own span's here.
        tracing.inject(headers)
        answer = self._call(
            "POST",
            "/renders",
            self.config.render,
            deadline,
            headers=headers,
            data=json.dumps(payload).encode(),
        )
        if not 200 <= answer.status < 300:
            raise RenderHTTPError(
                status=answer.status,
                retry_after=parse_retry_after(answer.headers.get("retry-after")),
            )
        try:
            data = json.loads(answer.body)
            render_id = str(data["render_id"])
        except (ValueError, KeyError, TypeError) as exc:
            raise RenderBadResponse() from exc
        if not render_id:
            raise RenderBadResponse()
        return RenderAccepted(render_id=render_id, replayed=bool(data.get("replayed")))

    # --- one bounded HTTP call --------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        limits: CallLimits,
        deadline: float,
        *,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> _Answer:
        start = self._clock()
        call_deadline = min(deadline, start + limits.total)
        remaining = call_deadline - start
        if remaining <= 0:
            raise RenderDeadlineExceeded(seconds=0.0)
        # urllib3's `total` caps connect + time to the first byte; the loop in _read_body
        # caps the rest. Each phase also keeps its own, shorter limit.
        timeout = Timeout(
            connect=min(limits.connect, remaining),
            read=min(limits.read, remaining),
            total=remaining,
        )
        sent_headers = {**(headers or {}), DEADLINE_HEADER: str(int(remaining * 1000))}
        try:
            response = self._session.request(
                method,
                self.config.base_url + path,
                headers=sent_headers,
                data=data,
                # requests hands a urllib3 Timeout to urllib3 as it is (HTTPAdapter.send);
                # types-requests only knows floats and tuples.
                timeout=timeout,  # type: ignore[arg-type]
                stream=True,
                allow_redirects=False,
            )
        except requests.exceptions.ConnectTimeout as exc:
            raise RenderTimedOut(phase="connect") from exc
        except requests.exceptions.ReadTimeout as exc:
            raise RenderTimedOut(phase="read") from exc
        except requests.exceptions.ConnectionError as exc:
            raise RenderConnectionFailed() from exc
        with response:
            body = self._read_body(response, call_deadline, limits)
        return _Answer(
            status=response.status_code,
            headers={k.lower(): v for k, v in response.headers.items()},
            body=body,
        )

    def _read_body(
        self, response: requests.Response, call_deadline: float, limits: CallLimits
    ) -> bytes:
        raw = response.raw
        chunks: list[bytes] = []
        size = 0
        while True:
            remaining = call_deadline - self._clock()
            if remaining <= 0:
                raise RenderDeadlineExceeded(seconds=limits.total)
            _shorten_socket_timeout(raw, min(limits.read, remaining))
            try:
                # read1: at most one network read, so the deadline is checked between reads.
                chunk = raw.read1(_CHUNK)
            except (urllib3_exceptions.TimeoutError, TimeoutError) as exc:
                if call_deadline - self._clock() <= 0:
                    raise RenderDeadlineExceeded(seconds=limits.total) from exc
                raise RenderTimedOut(phase="read") from exc
            except (urllib3_exceptions.HTTPError, OSError) as exc:
                raise RenderConnectionFailed() from exc
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > _MAX_BODY_BYTES:
                raise RenderBadResponse()
            chunks.append(chunk)


def _shorten_socket_timeout(raw: Any, seconds: float) -> None:
    connection = getattr(raw, "connection", None)
    sock = getattr(connection, "sock", None)
    if sock is not None:
        sock.settimeout(max(seconds, 0.001))
