"""Issue 30's finding, replayed against the Procfile's web server: a page on another site
posts a form (no body) to every buyer endpoint, the browser attaching the buyer's cached
Basic credentials or session cookie. Every one is refused, nothing is bought or redeemed.
The table of every identity, encoding and label is tests/console/test_api_access.py's."""

import base64
import http.client

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.test import Client

from recaps.models import RecapStatus, RecapVideo
from tests.recaps.factories import EventFactory, RecapFactory, UserFactory
from tests.support.processes import app_env, free_port, settings_database_url, start_procfile

CROSS_SITE_FORM = {
    "Origin": "https://evil.example",
    "Sec-Fetch-Site": "cross-site",
    "Content-Type": "application/x-www-form-urlencoded",
}


def request(port: int, method: str, path: str, headers: dict) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=b"" if method == "POST" else None, headers=headers)
        response = conn.getresponse()
        response.read()
        return response
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_cross_site_form_posts_to_the_real_server_are_refused(tmp_path):
    """About 5 s (the server's start)."""
    buyer = UserFactory.create(username="doors-buyer")
    # Hashed as production checks it (the test settings hash with MD5, which it refuses);
    # few iterations, as the stored hash names them: the server's check stays quick.
    buyer.password = PBKDF2PasswordHasher().encode("pw-doors", "doorsalt", iterations=1000)
    buyer.save(update_fields=["password"])
    event = EventFactory.create()
    free = RecapFactory.create(buyer=buyer, event=event, is_free=True)
    unpaid = RecapFactory.create(buyer=buyer, event=event)
    browser = Client()
    browser.force_login(buyer)
    credentials = {
        "basic": {"Authorization": "Basic " + base64.b64encode(b"doors-buyer:pw-doors").decode()},
        "session": {"Cookie": f"sessionid={browser.cookies['sessionid'].value}"},
    }
    paths = [
        "/recaps/",
        f"/recaps/{free.id}/",
        f"/recaps/{unpaid.id}/checkout/",
        f"/recaps/{free.id}/redeem/",
    ]

    port = free_port()
    web = start_procfile(
        "web",
        app_env(settings_database_url(), WEB_CONCURRENCY="1"),
        port=port,
        log=tmp_path / "web.log",
    )
    try:
        web.wait_listening(port, timeout=30)
        # The server does serve the buyer: the session reads its recap (Basic does not).
        assert request(port, "GET", f"/recaps/{free.id}/", credentials["session"]).status == 200
        answers = {
            (path, kind): request(port, "POST", path, {**CROSS_SITE_FORM, **headers})
            for path in paths
            for kind, headers in credentials.items()
        }
    finally:
        web.stop()

    statuses = {key: answer.status for key, answer in answers.items()}
    # Basic authenticates no one: a 401 asking for a token, never a Basic challenge a browser
    # would prompt for. The session: Django's CSRF check (no token, a foreign Origin).
    assert statuses == {
        **{(path, "basic"): 401 for path in paths},
        **{(path, "session"): 403 for path in paths},
    }, web.output()[-3000:]
    assert {answers[path, "basic"].getheader("WWW-Authenticate") for path in paths} == {"Token"}
    free.refresh_from_db()
    assert free.status == RecapStatus.PENDING_PAYMENT
    assert RecapVideo.objects.count() == 2
