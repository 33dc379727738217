"""The seed's failure story and its relatives, replayed against the fake render service over
HTTP with the production dispatcher (`dispatch_run`): the service fails in one of five ways
for far longer than a row's five attempts would last, recaps keep being paid, then it
recovers. Before issue 9 a 5xx (or 429, or hang) outage behind a green health check killed
every recap paid in it: each half-open probe was a health check, came back green and closed
the breaker, and the next claims burned real attempts.

The contract shown here: no recap `failed`, exactly one render per idempotency key, and
every row ends with exactly ONE charged attempt — the one that rendered. Rows were tried
during the outage, but an answer about the service is never the row's (issue 27): not
charged, whatever the traffic, and a row failing alone waits visibly instead of dying.

Time is simulated: the dispatcher runs with an injected `now` (every row, backoff and the
breaker's cool-down are computed from it); only the network calls take real time. Settings
compress time further: backoff 1..4 s (five attempts' worth of pauses: 1+2+4+4 = 11 s of
ceilings), cool-down 20 s, a 60 s horizon; the outage lasts 10 minutes, some 50 times that.
About 20 s for the module (the `hang` story waits out its calls' deadlines).
"""

from datetime import timedelta

import pytest

from outbox.dispatcher import dispatch_run
from outbox.models import RecapSideEffect
from recaps.models import RecapStatus, RecapVideo
from tests.recaps.fixtures import T0

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

OUTAGE = timedelta(minutes=10)
EVERY = timedelta(seconds=30)


@pytest.fixture
def compressed(settings):
    settings.OUTBOX_BACKOFF_BASE_SECONDS = 1.0
    settings.OUTBOX_BACKOFF_CAP_SECONDS = 4.0
    settings.OUTBOX_TRANSIENT_HORIZON_SECONDS = 60.0
    settings.RENDER_BREAKER_COOLDOWN_SECONDS = 20.0
    # A hanging call costs its whole deadline: keep it short so ten minutes stay quick.
    settings.RENDER_READ_TIMEOUT_SECONDS = 0.3
    settings.RENDER_TIMEOUT_SECONDS = 0.5


def _outage_then_recovery(fake_renderer, paid_recap, mode):
    fake_renderer.configure(mode=mode, retry_after=2)
    paid = []
    at = T0
    # Payments keep arriving during the outage, two every 30 s, and the dispatcher runs.
    while at < T0 + OUTAGE:
        paid += [paid_recap(now=at)[0] for _ in range(2)]
        dispatch_run(now=at)
        at += EVERY
    assert not RecapVideo.objects.filter(status=RecapStatus.FAILED).exists()
    assert not RecapSideEffect.objects.filter(status="dead").exists()

    fake_renderer.configure(mode="ok")
    for _ in range(20):  # bounded: ten simulated minutes at most
        dispatch_run(now=at)
        if not RecapSideEffect.objects.exclude(status="done").exists():
            break
        at += EVERY
    return paid


@pytest.mark.parametrize("mode", ["down", "unhealthy", "error_5xx", "rate_limited", "hang"])
def test_a_long_outage_of_any_kind_loses_no_recap_and_charges_no_row(
    fake_renderer, paid_recap, compressed, mode
):
    paid = _outage_then_recovery(fake_renderer, paid_recap, mode)

    assert set(RecapVideo.objects.values_list("status", flat=True)) == {RecapStatus.RENDERING}
    assert not RecapSideEffect.objects.filter(status="dead").exists()
    # Exactly one render per idempotency key, one key per recap.
    rows = list(RecapSideEffect.objects.all())
    assert len(fake_renderer.renders) == len(paid) == len(rows)
    assert set(fake_renderer.renders) == {row.idempotency_key for row in rows}
    for recap in paid:
        assert len(fake_renderer.renders_for_recap(str(recap.id))) == 1
    # The attempts as designed: one charged attempt per row, the one that rendered.
    assert {row.attempts for row in rows} == {1}
    # The outage was real: rows were tried, and not charged for it.
    outcomes = set(RecapSideEffect.objects.values_list("history__outcome", flat=True))
    assert "service_unavailable" in outcomes


def test_the_probe_is_a_real_dispatch_and_a_green_health_check_does_not_close_it(
    fake_renderer, paid_recap, compressed
):
    # /health answers 200 throughout, /renders 500: the breaker stays open from the moment
    # it opened until a real render succeeds.
    fake_renderer.configure(mode="error_5xx")
    for _ in range(10):
        paid_recap(now=T0)
    at = T0
    states = []
    for _ in range(20):
        states.append(dispatch_run(now=at).breaker)
        at += EVERY
    assert states[0] == "open" and set(states[1:]) == {"open"}
    # One probe per cool-down, each a real POST /renders: the breaker did not close again.
    posts = sum(fake_renderer.posts_by_key.values())
    assert 5 <= posts <= 5 + 20
    assert set(RecapSideEffect.objects.values_list("attempts", flat=True)) == {0}


def test_one_paid_recap_in_a_long_outage_is_tried_once_per_cooldown_and_never_charged(
    fake_renderer, paid_recap, compressed
):
    """Finding 5 of issue 27: with one row in flight a total outage never reached the
    breaker's threshold of distinct rows, so each failure was charged. Now nothing proven
    healthy means the first failure opens the breaker: the row is tried once per cool-down,
    never charged, and alive long past the attempts' worth of backoff and the horizon."""
    fake_renderer.configure(mode="error_5xx")
    recap, row = paid_recap(now=T0)
    at, every = T0, timedelta(seconds=5)
    while at < T0 + OUTAGE:
        dispatch_run(now=at)
        at += every
    row.refresh_from_db()
    tries = row.history.count()
    cooldowns = OUTAGE / timedelta(seconds=20)
    assert 1 <= tries <= cooldowns + 1, tries  # 120 runs, one try per 20 s cool-down
    assert sum(fake_renderer.posts_by_key.values()) == tries
    assert (row.status, row.attempts, row.first_failed_at) == ("pending", 0, None)
    assert row.waiting_since == T0 and row.wait_reason == "breaker"
    assert set(row.history.values_list("outcome", flat=True)) == {"service_unavailable"}
    fake_renderer.configure(mode="ok")
    for _ in range(5):
        dispatch_run(now=at)
        at += EVERY
    row.refresh_from_db()
    recap.refresh_from_db()
    assert (row.status, row.attempts) == ("done", 1)
    assert recap.status == RecapStatus.RENDERING


def test_a_row_the_service_fails_alone_waits_visibly_and_is_never_charged(
    settings, paid_recap, compressed
):
    """The service renders every other recap; this one gets a 500 every time. Before issue
    27 it died after five charged attempts. A 5xx is an answer about the service, never a
    verdict about the recap: it waits, uncharged, and the age of its wait (the alert's
    figure) grows while the others render once each."""
    import os

    from fakes.renderer import FakeRenderer, _Handler
    from outbox.selectors import side_effect_depths

    doomed_ids: set[str] = set()

    class OneRecapFails(_Handler):
        def _body(self):
            if not hasattr(self, "_cached_body"):
                self._cached_body = super()._body()
            return self._cached_body

        def _render(self):
            if self._body().get("recap_id") in doomed_ids:
                with self.fake.lock:
                    self.fake.posts_by_key[self.headers.get("Idempotency-Key", "")] += 1
                self._json(500, {"error": "internal"})
                return
            super()._render()

    fake = FakeRenderer(secret=os.environ["RENDERER_WEBHOOK_SECRET"], callbacks=False)
    fake._server.RequestHandlerClass = OneRecapFails
    settings.RENDER_SERVICE_URL = fake.url
    settings.RENDER_CALLBACK_URL = "http://127.0.0.1:9/webhooks/renderer/"
    with fake:
        doomed, doomed_row = paid_recap(now=T0)
        doomed_ids.add(str(doomed.id))
        at = T0
        others = []
        for _ in range(40):  # 20 simulated minutes: twenty times the 60 s horizon
            others += [paid_recap(now=at)[0] for _ in range(2)]
            dispatch_run(now=at)
            at += EVERY
    doomed.refresh_from_db()
    doomed_row.refresh_from_db()
    assert (doomed_row.status, doomed_row.attempts) == ("pending", 0)
    assert doomed.status == RecapStatus.PAID and doomed.failure_reason == ""
    assert doomed_row.last_error_class == "http_500" and doomed_row.waiting_since == T0
    assert fake.posts_by_key[doomed_row.idempotency_key] >= 5  # tried, again and again
    assert side_effect_depths(now=at)["oldest_waiting_age_seconds"] == (at - T0).total_seconds()
    # Everything else rendered, once.
    assert all(
        RecapVideo.objects.get(pk=recap.pk).status == RecapStatus.RENDERING for recap in others
    )
    assert all(len(fake.renders_for_recap(str(recap.id))) == 1 for recap in others)
