"""The fake Stripe as the development tool `make run` starts: its checkout page, the paid
checkout's signed webhook, and `manage.py run_fake_stripe` as a process of its own."""

import time

import pytest
import requests
from django.conf import settings

from fakes.stripe import FakeStripe
from ingress.inbox import inbox_run_once
from ingress.models import RawEvent
from ingress.sources import reset_sources_cache
from recaps.models import RecapStatus
from recaps.services import recap_checkout_create
from tests.recaps.factories import RecapFactory
from tests.support.processes import app_env, free_port, start_manage

TIMEOUT = (1, 10)


@pytest.mark.django_db
def test_the_checkout_page_takes_a_browser_through_payment(fake_stripe, live_server):
    fake_stripe.webhook_url = f"{live_server.url}/webhooks/stripe/"
    recap = RecapFactory.create()
    checkout = recap_checkout_create(recap=recap, buyer=recap.buyer)

    page = requests.get(checkout.url, timeout=TIMEOUT)
    assert page.status_code == 200 and "Pay (test mode)" in page.text
    assert "9.90 EUR" in page.text and str(recap.id) in page.text
    paid = requests.post(checkout.url, allow_redirects=False, timeout=TIMEOUT)
    assert paid.status_code == 303
    assert paid.headers["Location"] == f"http://127.0.0.1:8000/recaps/{recap.id}/?checkout=success"
    assert "Paid." in requests.get(checkout.url, timeout=TIMEOUT).text
    # Paying twice is refused; an unknown session is not found.
    again = requests.post(checkout.url, headers={"Accept": "application/json"}, timeout=TIMEOUT)
    assert again.status_code == 409
    unknown = f"{fake_stripe.url}/c/pay/cs_test_nope"
    assert requests.post(unknown, timeout=TIMEOUT).status_code == 404
    ((_, status),) = fake_stripe.webhooks_sent
    assert status == 202


def test_it_signs_with_one_secret_not_a_rotation_list():
    with pytest.raises(ValueError, match="one secret"):
        FakeStripe(webhook_secret="whsec_new,whsec_old")


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_run_fake_stripe_signs_with_the_current_secret_during_a_rotation(
    live_server, monkeypatch, tmp_path
):
    """The command as `make run` starts it: its webhook verifies against secret index 0."""
    rotation = "whsec_current_secret_0123,whsec_previous_secret_4567"
    monkeypatch.setenv("STRIPE_WEBHOOK_SECRET", rotation)
    reset_sources_cache()
    try:
        port = free_port()
        database = settings.DATABASES["default"]
        env = app_env(
            f"postgres://{database['USER']}@{database['HOST']}:{database['PORT']}/"
            f"{database['NAME']}",
            STRIPE_WEBHOOK_SECRET=rotation,
        )
        fake = start_manage(
            [
                "run_fake_stripe",
                "--port",
                str(port),
                "--webhook-url",
                f"{live_server.url}/webhooks/stripe/",
            ],
            env,
            log=tmp_path / "fake_stripe.log",
        )
        with fake:
            fake.wait_listening(port, timeout=30)
            recap = RecapFactory.create()
            session = requests.post(
                f"http://127.0.0.1:{port}/v1/checkout/sessions",
                data={"mode": "payment", "metadata[recap_id]": str(recap.id)},
                headers={"Idempotency-Key": "k1"},
                timeout=TIMEOUT,
            ).json()
            paid = requests.post(
                session["url"], headers={"Accept": "application/json"}, timeout=TIMEOUT
            )
            assert paid.status_code == 200 and paid.json()["webhook_status"] == 202, paid.text
            listed = requests.get(f"http://127.0.0.1:{port}/v1/events", timeout=TIMEOUT).json()
            assert [e["id"] for e in listed["data"]] == [paid.json()["event_id"]]
        deadline = time.monotonic() + 5
        while not RawEvent.objects.filter(source="stripe").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        inbox_run_once()
        event = RawEvent.objects.get(source="stripe")
        assert (event.signature_status, event.matched_secret_index) == ("verified", 0)
        recap.refresh_from_db()
        assert recap.status == RecapStatus.PAID
    finally:
        monkeypatch.undo()
        reset_sources_cache()
