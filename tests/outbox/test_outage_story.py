"""The seed's failure story, replayed: the render service restarts for two minutes while
recaps are being paid. Before the rebuild, a red health check wrote `failed` at once and
every recap paid in that window was lost for good. Now every one of them renders, once.

Time is simulated: the dispatcher runs with an injected `now` (every row, backoff and the
breaker's cool-down are computed from it); only the network calls take real time.
"""

from datetime import timedelta

import pytest

from outbox.dispatcher import dispatch_run
from outbox.models import RecapSideEffect
from recaps.models import RecapStatus, RecapVideo
from tests.recaps.fixtures import T0

pytestmark = pytest.mark.django_db

OUTAGE = timedelta(minutes=2)
EVERY_TWO_MINUTES = timedelta(minutes=2)


@pytest.mark.parametrize("outage_mode", ["unhealthy", "down"])
def test_a_two_minute_render_outage_loses_no_recap(fake_renderer, paid_recap, outage_mode):
    fake_renderer.configure(mode=outage_mode)
    paid = []
    # Payments keep arriving during the outage, one every ten seconds…
    for second in range(0, 120, 10):
        paid.append(paid_recap(now=T0 + timedelta(seconds=second))[0])
        # …and a dispatcher (several hosts, or an impatient operator) runs every 30 s.
        if second % 30 == 20:
            dispatch_run(now=T0 + timedelta(seconds=second))

    failed_during_outage = RecapSideEffect.objects.filter(attempts__gt=0).count()
    assert failed_during_outage > 0  # the outage was real: calls were made and failed
    assert not RecapVideo.objects.filter(status=RecapStatus.FAILED).exists()

    # The service is back after two minutes; the schedule keeps running every two minutes.
    fake_renderer.configure(mode="ok")
    at = T0 + OUTAGE
    for _ in range(30):  # bounded: 60 simulated minutes at most
        dispatch_run(now=at)
        if not RecapSideEffect.objects.exclude(status="done").exists():
            break
        at += EVERY_TWO_MINUTES

    statuses = set(RecapVideo.objects.values_list("status", flat=True))
    assert statuses == {RecapStatus.RENDERING}
    assert not RecapSideEffect.objects.filter(status="dead").exists()
    assert max(RecapSideEffect.objects.values_list("attempts", flat=True)) < 5
    # Every recap rendered exactly once: one render per recap, one key each.
    assert len(fake_renderer.renders) == len(paid)
    for recap in paid:
        assert len(fake_renderer.renders_for_recap(str(recap.id))) == 1
    assert set(fake_renderer.posts_by_key.values()) == {1}


def test_a_long_outage_costs_each_row_at_most_the_attempts_before_the_breaker_opened(
    fake_renderer, paid_recap
):
    # An hour down, the dispatcher running every two minutes throughout. Once the breaker
    # is open its probes are health checks, so no row pays for them: nothing dies.
    fake_renderer.configure(mode="down")
    rows = [paid_recap(now=T0)[1] for _ in range(10)]
    at = T0
    for _ in range(30):
        dispatch_run(now=at)
        at += EVERY_TWO_MINUTES
    attempts = list(RecapSideEffect.objects.values_list("attempts", flat=True))
    assert max(attempts) == 1 and attempts.count(1) == 5  # the threshold, no more
    assert not RecapSideEffect.objects.filter(status="dead").exists()
    assert fake_renderer.posts_by_key == {}  # down: nothing ever arrived

    fake_renderer.configure(mode="ok")
    dispatch_run(now=at + timedelta(hours=1))
    assert set(RecapVideo.objects.values_list("status", flat=True)) == {RecapStatus.RENDERING}
    assert set(fake_renderer.renders) == {row.idempotency_key for row in rows}
