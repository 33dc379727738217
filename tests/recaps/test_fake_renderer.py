"""The fake render service itself: control over HTTP, idempotency, signed callbacks."""

import contextlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
from standardwebhooks.webhooks import Webhook

from recaps.fake_renderer import FakeRenderer

SECRET = os.environ["RENDERER_WEBHOOK_SECRET"]


def post_render(fake, key, **extra):
    return requests.post(
        f"{fake.url}/renders",
        json={"recap_id": "r1", "photos": ["a"], **extra},
        headers={"Idempotency-Key": key},
        timeout=(1, 2),
    )


def test_modes_switch_at_runtime_over_http():
    with FakeRenderer(secret=SECRET, callbacks=False) as fake:
        assert requests.get(f"{fake.url}/health", timeout=(1, 2)).status_code == 200
        control = requests.post(f"{fake.url}/_control", json={"mode": "unhealthy"}, timeout=2)
        assert control.status_code == 200 and control.json()["mode"] == "unhealthy"
        assert requests.get(f"{fake.url}/health", timeout=(1, 2)).status_code == 503
        bad = requests.post(f"{fake.url}/_control", json={"mode": "melting"}, timeout=2)
        assert bad.status_code == 400


def test_same_key_same_render_never_two():
    with FakeRenderer(secret=SECRET, callbacks=False) as fake:
        first = post_render(fake, "k1")
        second = post_render(fake, "k1")
        assert (first.status_code, second.status_code) == (202, 200)
        assert first.json()["render_id"] == second.json()["render_id"]
        assert second.json()["replayed"] is True
        assert fake.stats()["renders"] == 1 and fake.posts_by_key["k1"] == 2
        assert post_render(fake, "").status_code == 400


def test_completion_callbacks_are_signed_standard_webhooks():
    received = []
    done = threading.Event()

    class Capture(BaseHTTPRequestHandler):
        def log_message(self, *args):
            return None

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((dict(self.headers), body))
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            done.set()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        with FakeRenderer(secret=SECRET, complete_after=0.01) as fake:
            callback_url = f"http://127.0.0.1:{server.server_address[1]}/cb"
            render_id = post_render(fake, "k1", callback_url=callback_url).json()["render_id"]
            assert done.wait(5)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    headers, body = received[0]
    headers = {k.lower(): v for k, v in headers.items()}
    payload = Webhook(SECRET).verify(body.decode(), headers)  # raises if the signature is bad
    assert payload["type"] == "render.completed"
    assert payload["data"]["render_id"] == render_id
    assert payload["data"]["video_url"].endswith(f"/{render_id}.mp4")
    assert json.loads(body)["data"]["idempotency_key"] == "k1"


def test_hang_releases_the_connection_at_the_callers_deadline():
    with FakeRenderer(secret=SECRET, callbacks=False) as fake:
        fake.configure(mode="hang", delay=10)
        started = time.monotonic()
        # The server drops the connection after 200 ms, long before a 3 s read timeout.
        with contextlib.suppress(requests.ConnectionError):
            requests.post(
                f"{fake.url}/renders",
                json={},
                headers={"Idempotency-Key": "k", "X-Request-Deadline-Ms": "200"},
                timeout=(1, 3),
            )
        assert time.monotonic() - started < 2.0
        assert fake.deadlines_ms == [200] and fake.renders == {}
