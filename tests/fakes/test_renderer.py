"""The fake render service itself: control over HTTP, idempotency, signed callbacks."""

import base64
import contextlib
import json
import os
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from django.conf import settings
from standardwebhooks.webhooks import Webhook

from fakes.renderer import FakeRenderer
from ingress.inbox import inbox_run_once
from ingress.models import RawEvent
from ingress.sources import reset_sources_cache
from recaps.models import RecapStatus
from recaps.services import recap_mark_rendering
from tests.recaps.factories import RecapFactory
from tests.recaps.fixtures import pay
from tests.support.processes import app_env, free_port, start_manage

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


def test_a_comma_separated_secret_list_is_refused_not_used_as_one_key():
    with pytest.raises(ValueError, match="one secret"):
        FakeRenderer(secret="whsec_a,whsec_b")


# --- GET /renders/<id>: what a caller asks when a completion callback never arrived -------


def test_status_is_rendering_then_the_outcome_it_was_accepted_with_without_callbacks():
    with FakeRenderer(secret=SECRET, callbacks=False, complete_after=0.3) as fake:
        render_id = post_render(fake, "k1").json()["render_id"]
        fake.configure(outcome="failed", complete_after=0.0)  # later renders only
        failed_id = post_render(fake, "k2").json()["render_id"]

        early = requests.get(f"{fake.url}/renders/{render_id}", timeout=(1, 2))
        assert early.status_code == 200 and early.json()["status"] == "rendering"
        time.sleep(0.35)
        done = requests.get(f"{fake.url}/renders/{render_id}", timeout=(1, 2)).json()
        assert done["status"] == "completed" and done["idempotency_key"] == "k1"
        assert done["video_url"].endswith(f"/{render_id}.mp4")
        failed = requests.get(f"{fake.url}/renders/{failed_id}", timeout=(1, 2)).json()
        assert failed["status"] == "failed" and failed["error"]["code"] == "photos_unreadable"
        unknown = requests.get(f"{fake.url}/renders/rnd_nope", timeout=(1, 2))
        assert unknown.status_code == 404
        assert fake.status_requests[render_id] == 2 and fake.callbacks_sent == []


def test_status_follows_the_failure_modes():
    with FakeRenderer(secret=SECRET, callbacks=False) as fake:
        render_id = post_render(fake, "k1").json()["render_id"]
        for mode, status in (("error_5xx", 500), ("unhealthy", 503), ("rate_limited", 429)):
            fake.configure(mode=mode)
            answer = requests.get(f"{fake.url}/renders/{render_id}", timeout=(1, 2))
            assert answer.status_code == status, mode
        fake.configure(mode="down")
        with contextlib.suppress(requests.ConnectionError):
            requests.get(f"{fake.url}/renders/{render_id}", timeout=(1, 1))
        # "down" drops the connection before anything is counted.
        assert fake.status_requests[render_id] == 3


# --- rotation: `run_fake_renderer` with two secrets, through the real ingress and inbox ---


def _whsec() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_fake_renderer_signs_with_the_current_secret_during_a_rotation(
    live_server, monkeypatch, tmp_path
):
    """RENDERER_WEBHOOK_SECRET="new,old": the command must sign with "new" (the first), and
    the ingress must accept it. It used to sign with the whole list as one key, so every
    callback was rejected (or never sent)."""
    new, old = _whsec(), _whsec()
    rotation = f"{new},{old}"
    monkeypatch.setenv("RENDERER_WEBHOOK_SECRET", rotation)
    reset_sources_cache()
    try:
        recap = RecapFactory.create()
        key = pay(recap).idempotency_key  # the callback answers the recap's current render
        port = free_port()
        database = settings.DATABASES["default"]
        env = app_env(
            f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/"
            f"{database['NAME']}",
            RENDERER_WEBHOOK_SECRET=rotation,
        )
        fake = start_manage(
            ["run_fake_renderer", "--port", str(port), "--complete-after", "0.05"],
            env,
            log=tmp_path / "fake_renderer.log",
        )
        with fake:
            fake.wait_listening(port, timeout=30)
            answer = requests.post(
                f"http://127.0.0.1:{port}/renders",
                json={
                    "recap_id": str(recap.id),
                    "photos": ["a.jpg"],
                    "callback_url": f"{live_server.url}/webhooks/renderer/",
                },
                headers={"Idempotency-Key": key},
                timeout=(1, 5),
            )
            assert answer.status_code == 202, answer.text
            recap_mark_rendering(recap_id=recap.id, render_id=answer.json()["render_id"])
            deadline = time.monotonic() + 15
            while not RawEvent.objects.filter(source="renderer").exists():
                assert time.monotonic() < deadline, fake.output()[-2000:]
                time.sleep(0.05)
        inbox_run_once()
        callback = RawEvent.objects.get(source="renderer")
        assert (callback.signature_status, callback.matched_secret_index) == ("verified", 0)
        recap.refresh_from_db()
        assert recap.status == RecapStatus.READY
    finally:
        monkeypatch.undo()
        reset_sources_cache()


def test_a_restart_forgets_every_render_and_accepts_a_key_anew():
    with FakeRenderer(secret=SECRET, callbacks=False) as fake:
        first = post_render(fake, "k1").json()["render_id"]
        control = requests.post(f"{fake.url}/_control", json={"restart": True}, timeout=2)
        assert control.status_code == 200 and control.json()["renders"] == 0
        assert requests.get(f"{fake.url}/renders/{first}", timeout=(1, 2)).status_code == 404
        again = post_render(fake, "k1")
        assert again.status_code == 202 and again.json()["render_id"] != first
        assert [r.idempotency_key for r in fake.accepted] == ["k1", "k1"]
        assert fake.posts_by_key["k1"] == 2  # test counters survive the restart


@pytest.mark.parametrize("status", [404, 409, 307, 401, 503])
def test_answer_mode_answers_like_a_deploy_while_health_stays_green(status):
    with FakeRenderer(secret=SECRET, callbacks=False) as fake:
        render_id = post_render(fake, "k1").json()["render_id"]
        fake.configure(mode="answer", status=status)
        assert requests.get(f"{fake.url}/health", timeout=(1, 2)).status_code == 200
        posted = requests.post(
            f"{fake.url}/renders",
            json={},
            headers={"Idempotency-Key": "k2"},
            timeout=(1, 2),
            allow_redirects=False,
        )
        asked = requests.get(
            f"{fake.url}/renders/{render_id}", timeout=(1, 2), allow_redirects=False
        )
        assert (posted.status_code, asked.status_code) == (status, status)
        if 300 <= status < 400:
            assert posted.headers["Location"] == "/maintenance"
        assert fake.stats()["renders"] == 1
        with pytest.raises(ValueError, match="3xx to 5xx"):
            fake.configure(mode="answer", status=200)
