"""`manage.py demo` against a real web server (pytest-django's live server), the fake Stripe
and the fake render service, each a real HTTP server: the demo's purchase reaches our ingress
as a correctly signed Stripe webhook, and both recaps become ready through the real inbox and
dispatcher — here run by the test, under `make run` by their own processes."""

import time
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from fakes.demo import DEMO_BUYER
from ingress.inbox import inbox_run_once
from ingress.models import RawEvent
from outbox.dispatcher import dispatch_run
from recaps.models import Event, RecapStatus, RecapVideo

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running_app(live_server, fake_stripe, fake_renderer, settings):
    settings.RENDER_CALLBACK_URL = f"{live_server.url}/webhooks/renderer/"
    settings.RENDER_READ_TIMEOUT_SECONDS = 5.0
    settings.RENDER_TIMEOUT_SECONDS = 6.0
    settings.STRIPE_READ_TIMEOUT_SECONDS = 5.0
    fake_renderer.configure(callbacks=True, complete_after=0.05)
    fake_stripe.webhook_url = f"{live_server.url}/webhooks/stripe/"
    return live_server


def demo(*args: str) -> str:
    out = StringIO()
    call_command("demo", *args, stdout=out)
    return out.getvalue()


def wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_demo_drives_a_free_and_a_paid_recap_to_ready(running_app, fake_stripe, fake_renderer):
    # Nothing runs the inbox or the dispatcher yet: the demo says where each recap waits.
    with pytest.raises(CommandError) as stuck:
        demo("--web-url", running_app.url, "--wait", "0.5")
    message = str(stuck.value)
    assert "paid recap" in message and "is pending_payment" in message
    assert "is the inbox worker running" in message
    assert "free recap" in message and "is paid" in message
    assert "is the dispatcher running" in message

    event = Event.objects.get()
    assert event.photos.count() == 6
    free = RecapVideo.objects.get(is_free=True)
    paid = RecapVideo.objects.get(is_free=False)
    assert free.buyer == paid.buyer and free.buyer.get_username() == DEMO_BUYER
    assert not free.buyer.has_usable_password()
    # The fake Stripe POSTed the payment to our ingress, signed: 202, and it verifies.
    ((event_id, status),) = fake_stripe.webhooks_sent
    assert status == 202
    inbox_run_once()
    payment = RawEvent.objects.get(source="stripe")
    assert payment.signature_status == "verified" and event_id in payment.dedup_key
    paid.refresh_from_db()
    assert paid.status == RecapStatus.PAID and paid.payment_reference.startswith("pi_fake_")

    # The dispatcher and the render service's callbacks finish both.
    report = dispatch_run()
    assert report.count("done") == 2, report.summary()
    assert wait_for(lambda: len(fake_renderer.callbacks_sent) == 2)
    inbox_run_once()
    for recap in (free, paid):
        recap.refresh_from_db()
        assert recap.status == RecapStatus.READY and recap.video_url.startswith("https://")

    # The fake Stripe lists the events it sent: the README's reconcile_stripe finds ours.
    # (A window ends at the latest now, exclusive, in whole seconds: let the second of the
    # event's `created` pass.)
    (listed,) = fake_stripe.events
    assert wait_for(lambda: time.time() >= listed["created"] + 1, seconds=2)
    now = datetime.now(tz=UTC)
    out = StringIO()
    call_command(
        "reconcile_stripe",
        "--since",
        (now - timedelta(minutes=5)).isoformat(),
        "--until",
        (now + timedelta(seconds=5)).isoformat(),
        stdout=out,
    )
    assert "Stripe listed 1, known 1" in out.getvalue() and "missing 0" in out.getvalue()


def test_a_second_demo_run_reuses_the_buyer_and_never_repeats_a_payment(running_app, fake_stripe):
    demo("--web-url", running_app.url, "--wait", "0")
    # A restarted fake Stripe (numbering its sessions from 1 again) must not collide either.
    fake_stripe.sessions.clear()
    demo("--web-url", running_app.url, "--wait", "0")
    assert get_user_model().objects.filter(username=DEMO_BUYER).count() == 1
    assert Event.objects.count() == 2
    # The restarted fake reuses session ids, and one session's events run one at a time
    # (the checkout handler's ordering key): a pass for each.
    for _ in range(3):
        inbox_run_once()
    paid = RecapVideo.objects.filter(is_free=False)
    assert {r.status for r in paid} == {RecapStatus.PAID}
    assert len({r.payment_reference for r in paid}) == 2


def test_without_the_fake_stripe_the_demo_names_it_and_writes_nothing(settings, live_server):
    settings.STRIPE_API_BASE = "http://127.0.0.1:9"
    with pytest.raises(
        CommandError, match=r"the fake Stripe does not answer at http://127\.0\.0\.1:9/"
    ):
        demo("--web-url", live_server.url)
    assert not Event.objects.exists()


def test_demo_failing_makes_one_incident_of_dead_deliveries(live_server):
    from console.incidents.services import incident_groups
    from fakes import failing as handlers
    from ingress.handlers import unregister

    name = f"{handlers.demo_failure.__module__}.demo_failure"
    try:
        out = demo("--failing", "--web-url", live_server.url, "--wait", "0")
        assert "3 GitHub webhooks for the failing handler" in out and "/ops/incidents/" in out
        inbox_run_once()
        (group,) = incident_groups(kind="dead_deliveries")
        assert (group.scope, group.error_class, group.rows) == (name, "DemoFailure", 3)
    finally:
        unregister(name)
    with pytest.raises(CommandError, match="failing handler is not registered"):
        demo("--failing", "--web-url", live_server.url)
