"""The render-service client against the fake service over real HTTP: every call bounded."""

import random
import socket
import time
from datetime import UTC, datetime

import pytest

from kernel.retry import RetryPolicy
from outbox.errors import (
    RenderConnectionFailed,
    RenderDeadlineExceeded,
    RenderHTTPError,
    RenderNotConfigured,
    RenderTimedOut,
    RenderUnhealthy,
)
from outbox.render_client import CallLimits, RenderClient, RenderClientConfig, parse_retry_after

KEY = "recap-test-render-g0"
BODY = {"recap_id": "r1", "event_id": 1, "photos": ["a.jpg"]}


def config(url: str, **overrides) -> RenderClientConfig:
    values = {
        "base_url": url,
        "callback_url": "http://127.0.0.1:9/cb/",
        "health": CallLimits(connect=1.0, read=1.0, total=2.0),
        "render": CallLimits(connect=1.0, read=1.0, total=2.0),
        "status": CallLimits(connect=1.0, read=1.0, total=2.0),
        "attempts": 1,
        "backoff": RetryPolicy(max_attempts=1, base_seconds=0.01, cap_seconds=0.02),
    }
    return RenderClientConfig(**{**values, **overrides})


def request(client: RenderClient, seconds: float = 5.0):
    return client.request_render(
        idempotency_key=KEY, body=BODY, deadline=time.monotonic() + seconds
    )


def test_request_carries_the_key_the_callback_and_the_remaining_deadline(fake_renderer):
    accepted = request(RenderClient(config(fake_renderer.url)))
    render = fake_renderer.renders[KEY]
    assert accepted.render_id == render.render_id and not accepted.replayed
    assert render.callback_url == "http://127.0.0.1:9/cb/" and render.recap_id == "r1"
    # The render call's own 2.0 s deadline is what is left when it starts.
    assert 1800 <= fake_renderer.deadlines_ms[0] <= 2000
    assert request(RenderClient(config(fake_renderer.url))).replayed


def test_the_deadline_header_is_what_is_left_of_the_callers_deadline(fake_renderer):
    RenderClient(config(fake_renderer.url)).request_render(
        idempotency_key=KEY, body=BODY, deadline=time.monotonic() + 1.5
    )
    # The header is min(the call's own 2.0 s, what is left of the caller's deadline).
    assert fake_renderer.deadlines_ms[0] <= 1500
    RenderClient(config(fake_renderer.url)).request_render(
        idempotency_key=KEY + "x", body=BODY, deadline=time.monotonic() + 0.6
    )
    assert fake_renderer.deadlines_ms[1] <= 600


def test_health_red_is_raised_before_any_render_request(fake_renderer):
    fake_renderer.configure(mode="unhealthy")
    with pytest.raises(RenderUnhealthy):
        request(RenderClient(config(fake_renderer.url)))
    assert fake_renderer.posts_by_key == {}


def test_connection_refused():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: nothing listens
    with pytest.raises(RenderConnectionFailed):
        request(RenderClient(config(f"http://127.0.0.1:{port}")))


def test_a_hanging_service_is_a_read_timeout(fake_renderer):
    fake_renderer.configure(mode="hang", delay=5)
    started = time.monotonic()
    with pytest.raises(RenderTimedOut) as exc:
        request(RenderClient(config(fake_renderer.url)))
    assert exc.value.phase == "read"
    assert time.monotonic() - started < 1.8  # the 1.0 s read timeout, not the 5 s hang


def test_a_slow_drip_stops_at_the_call_deadline(fake_renderer):
    fake_renderer.configure(mode="drip", drip_interval=0.05)  # each byte well within 0.4 s
    cfg = config(fake_renderer.url, render=CallLimits(connect=0.5, read=0.4, total=1.0))
    started = time.monotonic()
    with pytest.raises(RenderDeadlineExceeded):
        request(RenderClient(cfg))
    elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 1.4


def test_http_errors_carry_status_and_retry_after(fake_renderer):
    fake_renderer.configure(mode="rate_limited", retry_after=17)
    with pytest.raises(RenderHTTPError) as exc:
        request(RenderClient(config(fake_renderer.url)))
    assert (exc.value.status, exc.value.retry_after) == (429, 17.0)


def test_in_call_retries_pause_and_then_succeed(fake_renderer):
    fake_renderer.configure(mode="error_5xx")
    pauses = []

    def sleep(seconds):  # the service recovers while we wait
        pauses.append(seconds)
        fake_renderer.configure(mode="ok")

    cfg = config(
        fake_renderer.url,
        attempts=3,
        backoff=RetryPolicy(max_attempts=3, base_seconds=0.01, cap_seconds=0.02),
    )
    accepted = RenderClient(cfg, sleep=sleep).request_render(
        idempotency_key=KEY, body=BODY, deadline=time.monotonic() + 10
    )
    assert accepted.render_id and len(pauses) == 1 and pauses[0] <= 0.01
    assert fake_renderer.posts_by_key[KEY] == 2


def test_in_call_retries_never_pause_past_the_deadline(fake_renderer):
    fake_renderer.configure(mode="error_5xx")
    cfg = config(
        fake_renderer.url,
        attempts=4,
        backoff=RetryPolicy(max_attempts=4, base_seconds=30, cap_seconds=30),
    )

    class Ceiling(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b

    def sleep(seconds):  # pragma: no cover - must not be reached
        raise AssertionError("slept past the deadline")

    with pytest.raises(RenderHTTPError):
        RenderClient(cfg, sleep=sleep, rng=Ceiling()).request_render(
            idempotency_key=KEY, body=BODY, deadline=time.monotonic() + 5
        )
    assert fake_renderer.posts_by_key[KEY] == 1


def test_permanent_errors_are_not_retried_in_call(fake_renderer):
    fake_renderer.configure(mode="error_4xx")
    cfg = config(
        fake_renderer.url,
        attempts=3,
        backoff=RetryPolicy(max_attempts=3, base_seconds=0.01, cap_seconds=0.02),
    )
    with pytest.raises(RenderHTTPError):
        request(RenderClient(cfg, sleep=lambda s: None))
    assert fake_renderer.posts_by_key[KEY] == 1


@pytest.mark.parametrize("missing", ["base_url", "callback_url"])
def test_missing_configuration(missing):
    with pytest.raises(RenderNotConfigured):
        request(RenderClient(config("http://127.0.0.1:9", **{missing: ""})))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        ("0", 0.0),
        ("Mon, 01 Jun 2026 12:01:00 GMT", 60.0),
        ("Mon, 01 Jun 2026 11:00:00 GMT", 0.0),
        ("soon", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_retry_after(value, seconds):
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    assert parse_retry_after(value, now=now) == seconds
