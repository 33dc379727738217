"""The ops page: who may see it, its figures on a known store, and where the colours flip."""

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client import Histogram

from console.ops.figures import (
    ACK_PERCENTILE,
    LAG_WINDOW,
    SLOS,
    Level,
    histogram_quantile,
    ops_snapshot,
    raw_event_lags,
)
from ingress.models import Delivery, RawEvent, ReconciliationRun
from ingress.receive import ACK_SECONDS
from ingress.sources import all_sources
from outbox.breaker import RENDER_SERVICE_BREAKER
from outbox.models import CircuitBreaker, RecapSideEffect
from tests.console.conftest import grant
from tests.console.samples import paid_recap

pytestmark = pytest.mark.django_db

OPS = "/ops/"
STRIPE_HEADERS = {"HTTP_STRIPE_SIGNATURE": "t=1700000000,v1=deadbeef"}


# --- a known store ------------------------------------------------------------------------------


def raw_event(
    now,
    *,
    source: str = "github",
    ago: timedelta,
    status: str = "verified",
    reason: str = "",
    verify_lag: float | None = 1.0,
    handle_lag: float | None = None,
    dispatch: str | None = None,
    body: bytes = b"{}",
) -> RawEvent:
    """A stored event received `ago` before now; lags in seconds (None: not there yet)."""
    received_at = now - ago
    verified_at = None
    if status != "pending" and verify_lag is not None:
        verified_at = received_at + timedelta(seconds=verify_lag)
    if dispatch is None:
        dispatch = {"pending": "waiting", "rejected": "not_dispatched"}.get(status, "dispatched")
    handled_at = None
    if verified_at is not None and handle_lag is not None:
        handled_at = verified_at + timedelta(seconds=handle_lag)
    return RawEvent(
        source=source,
        provider=all_sources()[source].provider if source in all_sources() else "hmac",
        method="POST",
        path=f"/webhooks/{source}/",
        headers={"x-secret-looking-header": "never-exported"},
        body=body,
        body_sha256="0" * 64,
        received_at=received_at,
        signature_status=status,
        rejection_reason=reason,
        verified_at=verified_at,
        handled_at=handled_at,
        dispatch_status=dispatch,
    )


def build_known_store(now, client, user) -> dict:
    """Events, deliveries, side effects and a breaker whose figures the tests know."""
    minutes = lambda n: timedelta(minutes=n)  # noqa: E731
    hours = lambda n: timedelta(hours=n)  # noqa: E731
    events = RawEvent.objects.bulk_create(
        [
            # github: 4 in the last hour, 7 in the last 24 h, 1 older.
            *(raw_event(now, ago=minutes(10 + n), verify_lag=2, handle_lag=1) for n in range(3)),
            raw_event(now, ago=minutes(30), status="rejected", reason="bad_signature"),
            raw_event(now, ago=hours(5)),
            raw_event(now, ago=hours(6)),
            raw_event(now, ago=hours(10), status="rejected", reason="stale_timestamp"),
            raw_event(now, ago=hours(30)),
            # stripe: 1 pending (10 s), 2 rejected two hours ago.
            raw_event(now, source="stripe", ago=timedelta(seconds=10), status="pending"),
            *(
                raw_event(
                    now, source="stripe", ago=hours(2), status="rejected", reason="bad_signature"
                )
                for _ in range(2)
            ),
        ]
    )
    target = events[0].id
    due = now - timedelta(seconds=100)
    Delivery.objects.bulk_create(
        [
            Delivery(raw_event_id=target, handler="h.pending", next_attempt_at=due),
            Delivery(
                raw_event_id=target, handler="h.processing", status="processing", claimed_at=now
            ),
            Delivery(raw_event_id=target, handler="h.done1", status="done"),
            Delivery(raw_event_id=target, handler="h.done2", status="done"),
            Delivery(raw_event_id=target, handler="h.dead", status="dead", last_error="boom"),
        ]
    )
    side_effects = [RecapSideEffect.objects.get(recap=paid_recap(client, user)) for _ in range(3)]
    RecapSideEffect.objects.filter(pk=side_effects[0].pk).update(
        next_attempt_at=now - timedelta(seconds=700)
    )
    RecapSideEffect.objects.filter(pk=side_effects[1].pk).update(
        status="dead", last_error="HTTP 500"
    )
    RecapSideEffect.objects.filter(pk=side_effects[2].pk).update(status="done")
    CircuitBreaker.objects.create(
        name=RENDER_SERVICE_BREAKER,
        state="open",
        consecutive_failures=5,
        opened_at=now,
        open_until=now + timedelta(seconds=60),
        last_error_class="timeout",
    )
    return {"events": events}


def reconciliation_run(
    now,
    *,
    provider: str,
    scope: str = "",
    ago: timedelta,
    listed: int = 10_000,
    missing: int | None = 0,
) -> ReconciliationRun:
    """A finished run; missing=None makes it a failed one (it measured nothing)."""
    finished_at = now - ago
    failed = missing is None
    missing = missing or 0
    return ReconciliationRun.objects.create(
        provider=provider,
        source=provider,
        scope=scope,
        window_start=finished_at - timedelta(days=2),
        window_end=finished_at,
        started_at=finished_at - timedelta(minutes=1),
        finished_at=finished_at,
        status="failed" if failed else "complete",
        error="HTTP 401" if failed else "",
        provider_count=0 if failed else listed,
        known_count=0 if failed else listed - missing,
        missing_count=0 if failed else missing,
        drift=None if failed else missing / listed,
    )


def build_reconciliation(now) -> None:
    """Newest finished runs: stripe 0.002 %, github hook 1 0.02 %, github hook 2 failed."""
    reconciliation_run(now, provider="stripe", ago=timedelta(days=1), missing=5000)  # older
    reconciliation_run(now, provider="stripe", ago=timedelta(hours=2), missing=0, listed=50_000)
    reconciliation_run(now, provider="stripe", ago=timedelta(hours=1), missing=1, listed=50_000)
    reconciliation_run(
        now, provider="github", scope="repo acme/app hook 1", ago=timedelta(hours=3), missing=2
    )
    reconciliation_run(
        now, provider="github", scope="repo acme/web hook 2", ago=timedelta(hours=3), missing=None
    )


@pytest.fixture
def now():
    return timezone.now()


@pytest.fixture
def known_store(now, client, admin_user):
    return build_known_store(now, client, admin_user)


@pytest.fixture
def ops_viewer(django_user_model):
    user = django_user_model.objects.create_user("oncall", password="pw-oncall", is_staff=True)
    return grant(user, "console.view_ops")


# --- who may see it ----------------------------------------------------------------------------


def test_anonymous_is_sent_to_the_admin_login(client):
    response = client.get(OPS)
    assert response.status_code == 302
    assert response["Location"] == "/admin/login/?next=/ops/"


def test_signed_in_non_staff_is_sent_to_the_admin_login(client, django_user_model):
    user = grant(django_user_model.objects.create_user("visitor"), "console.view_ops")
    client.force_login(user)
    response = client.get(OPS)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_without_the_permission_is_forbidden(client, operator):
    # `operator` holds every other console permission, just not this one.
    client.force_login(operator)
    assert client.get(OPS).status_code == 403


def test_staff_with_the_permission_and_superusers_see_it(client, ops_viewer, admin_client):
    client.force_login(ops_viewer)
    assert client.get(OPS).status_code == 200
    assert admin_client.get(OPS).status_code == 200


def test_the_admin_index_links_the_page_for_those_who_may_see_it(client, ops_viewer, operator):
    client.force_login(ops_viewer)
    assert 'href="/ops/"' in client.get("/admin/").content.decode()
    client.force_login(operator)
    page = client.get("/admin/")
    assert page.status_code == 200 and 'href="/ops/"' not in page.content.decode()


# --- the figures --------------------------------------------------------------------------------


def test_figures_on_a_known_store(known_store, now):
    snapshot = ops_snapshot(now=now)

    volume = {v.source: v for v in snapshot.sources}
    assert set(volume) == set(all_sources())  # quiet sources are listed with zeros
    github, stripe = volume["github"], volume["stripe"]
    assert (github.last_hour, github.last_24h) == (4, 7)
    assert (github.verified_24h, github.rejected_24h, github.pending_24h) == (5, 2, 0)
    assert (stripe.last_hour, stripe.last_24h) == (1, 3)
    assert (stripe.verified_24h, stripe.rejected_24h, stripe.pending_24h) == (0, 2, 1)
    assert volume["slack"].last_24h == 0

    assert [(r.source, r.reason, r.last_hour, r.last_24h) for r in snapshot.rejections] == [
        ("stripe", "bad_signature", 0, 2),
        ("github", "bad_signature", 1, 1),
        ("github", "stale_timestamp", 0, 1),
    ]

    assert snapshot.inbox["raw_events_pending"] == 1
    assert snapshot.inbox["raw_events_oldest_pending_age_seconds"] == pytest.approx(10)
    assert snapshot.inbox["deliveries"] == {"pending": 1, "processing": 1, "dead": 1, "held": 0}
    assert snapshot.inbox["deliveries_oldest_due_age_seconds"] == pytest.approx(100)
    # `done` is volume, not depth: not counted (it would read every side effect ever made).
    assert (snapshot.outbox["pending"], snapshot.outbox["dead"]) == (1, 1)
    assert "done" not in snapshot.outbox
    assert snapshot.outbox["oldest_due_age_seconds"] == pytest.approx(700)
    assert snapshot.breaker_state == "open" and snapshot.breaker_level == Level.RED

    levels = {figure.slo.key: figure.level for figure in snapshot.figures()}
    assert levels["dead_deliveries"] == Level.RED
    assert levels["dead_side_effects"] == Level.RED
    assert levels["side_effects_oldest_due_age"] == Level.RED  # 700 s >= 600 s
    assert levels["deliveries_oldest_due_age"] == Level.GREEN  # 100 s < 150 s
    assert levels["raw_events_oldest_pending_age"] == Level.GREEN  # 10 s < 30 s
    assert snapshot.worst_level() == Level.RED


def test_lag_p95_of_a_constructed_distribution(now):
    # 100 events in the window, verified after 1..100 s and handled 2..200 s after that:
    # the interpolated p95 (percentile_cont) is at rank 0.95 * 99 = 94.05.
    RawEvent.objects.bulk_create(
        raw_event(now, ago=timedelta(minutes=50), verify_lag=n, handle_lag=2 * n)
        for n in range(1, 101)
    )
    # Outside the window: ignored however slow.
    RawEvent.objects.bulk_create(
        [raw_event(now, ago=LAG_WINDOW + timedelta(minutes=1), verify_lag=9999)]
    )
    lags = raw_event_lags(now=now)
    assert lags.verification_events == 100 and lags.processing_events == 100
    assert lags.verification_p95 == pytest.approx(95.05)
    assert lags.processing_p95 == pytest.approx(190.1)


def test_waiting_events_count_with_their_age_so_far(now):
    # A stalled worker: nothing verified for the last 20 minutes. Without counting the
    # waiting events the p95 would be the 1 s of the few that got through.
    RawEvent.objects.bulk_create(
        [
            *(
                raw_event(now, ago=timedelta(minutes=40), verify_lag=1, dispatch="no_handler")
                for _ in range(5)
            ),
            *(raw_event(now, ago=timedelta(minutes=20), status="pending") for _ in range(5)),
            # verified, dispatched, deliveries still running after 10 minutes
            raw_event(now, ago=timedelta(minutes=11), verify_lag=60),
        ]
    )
    lags = raw_event_lags(now=now)
    assert lags.verification_p95 == pytest.approx(1200)
    assert lags.processing_p95 == pytest.approx(600)
    assert lags.processing_events == 1


def test_rejected_duplicate_and_unhandled_events_have_no_processing_lag(now):
    RawEvent.objects.bulk_create(
        [
            raw_event(now, ago=timedelta(minutes=5), status="rejected", reason="bad_signature"),
            raw_event(now, ago=timedelta(minutes=5), dispatch="duplicate"),
            raw_event(now, ago=timedelta(minutes=5), dispatch="no_handler"),
        ]
    )
    lags = raw_event_lags(now=now)
    assert lags.processing_events == 0 and lags.processing_p95 is None
    assert lags.verification_events == 3 and lags.verification_p95 == pytest.approx(1)


def test_an_empty_store_has_no_lag_data_and_green_queues(now):
    snapshot = ops_snapshot(now=now)
    levels = {figure.slo.key: figure.level for figure in snapshot.figures()}
    assert levels["verification_lag_p95"] == Level.NO_DATA
    assert levels["processing_lag_p95"] == Level.NO_DATA
    assert levels["raw_events_oldest_pending_age"] == Level.GREEN
    assert levels["dead_deliveries"] == Level.GREEN
    assert levels["drift"] == Level.NO_DATA  # no reconciliation has run
    assert snapshot.breaker_state == "closed"  # no row: never tripped


# --- the colours --------------------------------------------------------------------------------


def _boundaries():
    for key, slo in SLOS.items():
        if slo.unit == "rows":
            yield pytest.param(key, 0, Level.GREEN, id=f"{key}-0")
            yield pytest.param(key, 1, Level.RED, id=f"{key}-1")
            yield pytest.param(key, 12, Level.RED, id=f"{key}-12")
            continue
        below = 1e-6
        yield pytest.param(key, 0.0, Level.GREEN, id=f"{key}-zero")
        yield pytest.param(key, slo.yellow_at - below, Level.GREEN, id=f"{key}-below-yellow")
        yield pytest.param(key, slo.yellow_at, Level.YELLOW, id=f"{key}-at-yellow")
        yield pytest.param(key, slo.red_at - below, Level.YELLOW, id=f"{key}-below-red")
        yield pytest.param(key, slo.red_at, Level.RED, id=f"{key}-at-red")
    yield pytest.param("verification_lag_p95", None, Level.NO_DATA, id="no-data")


@pytest.mark.parametrize(("key", "value", "level"), list(_boundaries()))
def test_colours_flip_at_the_thresholds(key, value, level):
    assert SLOS[key].level(value) == level


@pytest.mark.parametrize(
    ("key", "red_at", "yellow_at"),
    [
        ("ack_p99", 0.250, 0.125),
        ("verification_lag_p95", 60, 30),
        ("processing_lag_p95", 300, 150),
        ("dead_deliveries", 1, 0.5),
        ("dead_side_effects", 1, 0.5),
        ("drift", 0.0001, 0.00005),
    ],
)
def test_red_lines_are_the_design_slos(key, red_at, yellow_at):
    assert SLOS[key].red_at == red_at and SLOS[key].yellow_at == yellow_at


# --- reconciliation drift -----------------------------------------------------------------------


def test_drift_is_the_worst_newest_run(now):
    build_reconciliation(now)
    snapshot = ops_snapshot(now=now)
    latest = {(run.provider, run.scope): run for run in snapshot.reconciliation}
    assert len(latest) == 3
    assert latest[("stripe", "")].drift == pytest.approx(0.00002)  # not the older 50 %
    assert latest[("github", "repo acme/web hook 2")].drift is None  # failed: no figure
    assert snapshot.worst_drift == pytest.approx(0.0002)
    figure = next(f for f in snapshot.figures() if f.slo.key == "drift")
    assert figure.level == Level.RED and figure.display == "0.0200 %"


def test_drift_red_line_is_the_reconciliation_setting(settings):
    # One number for the reconciliation commands (--fail-on-drift) and this page.
    settings.RECONCILE_DRIFT_SLO = 0.001
    assert SLOS["drift"].red_at == 0.001 and SLOS["drift"].yellow_at == 0.0005
    assert SLOS["drift"].level(0.0002) == Level.GREEN


def test_the_page_lists_the_latest_runs_with_their_colour(client, ops_viewer, now):
    build_reconciliation(now)
    client.force_login(ops_viewer)
    page = client.get(OPS).content.decode()
    # oldest first, so each (provider, scope) ends with its newest run
    runs = {(r.provider, r.scope): r.pk for r in ReconciliationRun.objects.order_by("started_at")}
    assert f'id="reconciliation-{runs[("stripe", "")]}" data-level="green"' in page
    assert (
        f'id="reconciliation-{runs[("github", "repo acme/app hook 1")]}" data-level="red"' in page
    )
    assert f'href="/admin/ingress/reconciliationrun/{runs[("stripe", "")]}/change/"' in page
    assert 'id="slo-drift" data-level="red"' in page


# --- ACK latency --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("buckets", "expected"),
    [
        ([], None),
        ([(0.1, 0), (float("inf"), 0)], None),
        # rank 99 of 100 inside (0.1, 0.25]: 0.1 + 0.15 * 49/50
        ([(0.1, 50), (0.25, 100), (float("inf"), 100)], 0.247),
        # beyond the last finite bucket: its bound, as Prometheus answers
        ([(0.1, 0), (float("inf"), 10)], 0.1),
    ],
)
def test_histogram_quantile(buckets, expected):
    result = histogram_quantile(ACK_PERCENTILE, buckets)
    assert result == (pytest.approx(expected) if expected is not None else None)


def _private_ack_histogram() -> Histogram:
    """Same name as the receive view's, so the page reads it; none of its observations."""
    [metric] = ACK_SECONDS.describe()
    name = metric.name
    return Histogram(name, "test copy", ["source"], buckets=(0.005, 0.25, 0.5), registry=None)


@pytest.mark.parametrize(
    ("slow", "level"), [(0, Level.GREEN), (2, Level.RED)], ids=["fast", "two-slow"]
)
def test_ack_p99_colour_from_the_histogram(client, ops_viewer, monkeypatch, slow, level):
    from console.ops import figures as ops

    histogram = _private_ack_histogram()
    for n in range(100):
        histogram.labels(source="stripe").observe(0.3 if n < slow else 0.004)
    monkeypatch.setattr(ops, "ack_latency_collectors", lambda: [histogram])
    client.force_login(ops_viewer)
    response = client.get(OPS)
    assert response.status_code == 200
    figure = next(f for f in response.context["figures"] if f.slo.key == "ack_p99")
    assert figure.level == level
    assert f'id="slo-ack_p99" data-level="{level}"' in response.content.decode()


def test_an_acknowledged_webhook_is_observed_without_a_query(client, django_assert_num_queries):
    count_before = ops_snapshot_ack_count()
    with django_assert_num_queries(1):
        response = client.generic(
            "POST", "/webhooks/stripe/", b"{}", content_type="application/json", **STRIPE_HEADERS
        )
    assert response.status_code == 202
    assert ops_snapshot_ack_count() == count_before + 1


def test_refused_webhooks_are_not_acks(client):
    count_before = ops_snapshot_ack_count()
    assert (
        client.post("/webhooks/stripe/", b"{}", content_type="application/json").status_code == 400
    )
    assert client.get("/webhooks/stripe/").status_code == 405
    assert ops_snapshot_ack_count() == count_before


def ops_snapshot_ack_count() -> int:
    from console.ops.figures import ack_latency

    return ack_latency().count


# --- the page -----------------------------------------------------------------------------------


def test_the_page_shows_the_figures_colours_and_links(
    client, ops_viewer, known_store, django_assert_max_num_queries
):
    client.force_login(ops_viewer)
    # Session, user, permissions, then the figures' own queries: no query per row; the
    # charts add one grouped query each (lags, dead deliveries, dead side effects, the ACK
    # roll-up; the volume chart comes from the volume table's own scan); four for bulk jobs
    # and pauses (the replay SLO, active jobs, pauses in force, held deliveries); four for
    # the drain rates; six for the incidents (a GROUP BY per kind, their acknowledgements);
    # one for the questioned events; three for the sources' and handlers' lanes.
    with django_assert_max_num_queries(36):
        response = client.get(OPS)
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0")
    page = response.content.decode()
    assert 'id="slo-dead_deliveries" data-level="red"' in page
    assert 'id="slo-side_effects_oldest_due_age" data-level="red"' in page
    assert 'id="slo-deliveries_oldest_due_age" data-level="green"' in page
    assert 'href="/admin/ingress/delivery/?status__exact=dead"' in page
    assert 'href="/admin/outbox/recapsideeffect/?status__exact=dead"' in page
    assert 'id="breaker" data-state="open"' in page
    assert 'id="rejected-stripe-bad_signature"' in page
    assert "rejection_reason__exact=bad_signature" in page
    assert "signature status, reason" not in page  # sanity: no template debris
    assert "never-exported" not in page  # headers and bodies never reach this page


def test_the_rejection_link_opens_the_matching_events_in_the_admin(
    client, admin_client, known_store, now
):
    response = admin_client.get(OPS)
    link = next(
        item["link"]
        for item in response.context["rejections"]
        if (item["row"].source, item["row"].reason) == ("github", "bad_signature")
    )
    listing = admin_client.get(link)
    assert listing.status_code == 200
    assert [e.rejection_reason for e in listing.context["cl"].result_list] == ["bad_signature"]


def _waiting_rows(client, user):
    """Pending render rows: two waiting for the breaker, one after its own error."""
    rows = [RecapSideEffect.objects.get(recap=paid_recap(client, user)) for _ in range(4)]
    for row, reason in zip(rows, ["breaker", "breaker", "own_error", ""], strict=True):
        RecapSideEffect.objects.filter(pk=row.pk).update(wait_reason=reason)
    # A done row that once waited for the breaker is not waiting any more.
    RecapSideEffect.objects.filter(pk=paid_recap(client, user).side_effects.get().pk).update(
        status="done", wait_reason="breaker"
    )


def test_the_snapshot_tells_rows_waiting_for_the_breaker_from_their_own_errors(client, admin_user):
    _waiting_rows(client, admin_user)
    snapshot = ops_snapshot()
    assert snapshot.side_effects_waiting == {
        "breaker": 2,
        "ambiguous": 0,
        "database": 0,
        "own_error": 1,
        "configuration": 0,
    }


def test_the_page_shows_why_side_effects_wait(client, ops_viewer, admin_user):
    _waiting_rows(client, admin_user)
    client.force_login(ops_viewer)
    page = client.get(OPS).content.decode()
    assert '<span id="side-effects-waiting-breaker">2</span> waiting for the breaker' in page
    assert '<span id="side-effects-waiting-own-error">1</span> after their own error' in page
    assert "side-effects-waiting-configuration" not in page
