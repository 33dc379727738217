"""/metrics: who may scrape it, and that what it exposes parses and is right."""

from datetime import timedelta

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, Histogram, values
from prometheus_client.parser import text_string_to_metric_families

from ingress.models import RawEvent, RejectionReason
from ingress.sources import all_sources
from tests.console.conftest import grant
from tests.console.test_ops import (
    STRIPE_HEADERS,
    build_known_store,
    build_reconciliation,
    raw_event,
)

pytestmark = pytest.mark.django_db

METRICS = "/metrics"
TOKEN = "s3cret-scrape-token-0123456789abcdef"
ACK = "eventdrop_ingress_ack_seconds"


@pytest.fixture
def token(settings):
    settings.METRICS_BEARER_TOKEN = TOKEN
    return TOKEN


@pytest.fixture
def no_token(settings):
    settings.METRICS_BEARER_TOKEN = ""


@pytest.fixture
def ops_viewer(django_user_model):
    user = django_user_model.objects.create_user("oncall", password="pw-oncall", is_staff=True)
    return grant(user, "console.view_ops")


def bearer(value: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {value}"}


def scrape(client, **extra) -> dict:
    response = client.get(METRICS, **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def sample(families: dict, name: str, suffix: str = "", **labels) -> float:
    matches = [
        s.value
        for s in families[name].samples
        if s.name == name + suffix and s.labels == {k: str(v) for k, v in labels.items()}
    ]
    assert len(matches) == 1, (name, labels, families[name].samples)
    return matches[0]


# --- who may scrape -----------------------------------------------------------------------------


def test_without_a_token_anonymous_gets_401(client, no_token):
    response = client.get(METRICS)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"eventdrop" not in response.content


def test_without_a_token_any_bearer_is_refused(client, no_token):
    assert client.get(METRICS, **bearer("")).status_code == 401
    assert client.get(METRICS, **bearer("anything")).status_code == 401


def test_staff_without_the_permission_and_non_staff_get_403(client, no_token, operator, outsider):
    client.force_login(operator)
    assert client.get(METRICS).status_code == 403
    client.force_login(grant(outsider, "console.view_ops"))  # every permission, not staff
    assert client.get(METRICS).status_code == 403


def test_permitted_staff_may_read_it_in_a_browser(client, no_token, ops_viewer):
    client.force_login(ops_viewer)
    assert "eventdrop_raw_events_pending" in scrape(client)


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (f"Bearer {TOKEN}", 200),
        (f"bearer {TOKEN}", 200),  # the scheme is case-insensitive (RFC 9110)
        (f"Bearer {TOKEN[:-1]}", 401),
        (f"Bearer {TOKEN}x", 401),
        ("Bearer ", 401),
        (f"Basic {TOKEN}", 401),
        (TOKEN, 401),
    ],
    ids=["right", "lowercase-scheme", "short", "long", "empty", "basic", "no-scheme"],
)
def test_bearer_token(client, token, authorization, status):
    response = client.get(METRICS, HTTP_AUTHORIZATION=authorization)
    assert response.status_code == status
    if status == 401:
        assert b"eventdrop" not in response.content


def test_with_a_token_missing_credentials_are_401(client, token):
    assert client.get(METRICS).status_code == 401


def test_a_wrong_token_is_refused_even_with_a_staff_session(client, token, ops_viewer):
    client.force_login(ops_viewer)
    assert client.get(METRICS, **bearer("wrong")).status_code == 401
    assert client.get(METRICS).status_code == 200  # the session alone still works


def test_only_get(client, token):
    assert client.post(METRICS, **bearer(TOKEN)).status_code == 405


def test_scraping_with_the_token_needs_no_session_query(
    client, token, django_assert_max_num_queries
):
    # The figures' own queries only (eleven: delivery depths are three partial-index counts,
    # questioned events one more;
    # four more for bulk jobs and pauses: the replay SLO, active jobs, pauses, held
    # deliveries; four for the drain rates: verdicts, the day's first event id, finished
    # deliveries and side effects; six for incidents: one GROUP BY per kind and their
    # acknowledgements; three for the sources' and handlers' lanes: the pending raw events
    # by source, the unfinished deliveries by handler, the pace rows); no session, user or
    # permission lookup.
    with django_assert_max_num_queries(28):
        scrape(client, **bearer(TOKEN))


# --- what it exposes ----------------------------------------------------------------------------


def test_families_and_values_on_a_known_store(client, token, admin_user):
    from django.utils import timezone

    build_known_store(timezone.now(), client, admin_user)
    families = scrape(client, **bearer(TOKEN))

    assert sample(families, "eventdrop_raw_events_received_last_hour", source="github") == 4
    assert sample(families, "eventdrop_raw_events_received_last_hour", source="stripe") == 1
    assert sample(families, "eventdrop_raw_events_received_last_hour", source="slack") == 0
    day = "eventdrop_raw_events_received_last_24h"
    assert sample(families, day, source="github", signature_status="verified") == 5
    assert sample(families, day, source="github", signature_status="rejected") == 2
    assert sample(families, day, source="stripe", signature_status="pending") == 1
    assert sample(families, day, source="renderer", signature_status="verified") == 0
    rejected = "eventdrop_raw_events_rejected_last_24h"
    assert sample(families, rejected, source="stripe", reason="bad_signature") == 2
    assert sample(families, rejected, source="github", reason="bad_signature") == 1
    assert sample(families, rejected, source="github", reason="stale_timestamp") == 1
    assert sample(families, rejected, source="github", reason="unparseable_body") == 0

    assert sample(families, "eventdrop_raw_events_pending") == 1
    assert 10 <= sample(families, "eventdrop_raw_events_oldest_pending_age_seconds") < 70
    for status, count in {"pending": 1, "processing": 1, "dead": 1}.items():
        assert sample(families, "eventdrop_deliveries", status=status) == count
    assert 100 <= sample(families, "eventdrop_deliveries_oldest_due_age_seconds") < 160
    for status, count in {"pending": 1, "processing": 0, "dead": 1}.items():
        assert sample(families, "eventdrop_side_effects", status=status) == count
    assert sample(families, "eventdrop_side_effects_due") == 1
    assert sample(families, "eventdrop_side_effects_stale_processing") == 0
    assert 700 <= sample(families, "eventdrop_side_effects_oldest_due_age_seconds") < 760
    breaker = "eventdrop_circuit_breaker_state"
    assert sample(families, breaker, breaker="render-service", state="open") == 1
    assert sample(families, breaker, breaker="render-service", state="closed") == 0
    assert sample(families, breaker, breaker="render-service", state="half_open") == 0
    # Verification: github 2, 2, 2 (+1 rejected, 1 s) and stripe's pending one (10 s+).
    assert sample(families, "eventdrop_verification_lag_p95_seconds") > 2
    # Processing: the three handled github events, 1 s each.
    assert sample(families, "eventdrop_processing_lag_p95_seconds") == pytest.approx(1)
    assert families[ACK].type == "histogram"


def test_reconciliation_drift_per_provider_and_source(client, token):
    from django.utils import timezone

    now = timezone.now()
    build_reconciliation(now)
    response = client.get(METRICS, **bearer(TOKEN))
    text = response.content.decode()
    assert "acme" not in text  # scopes are free text, never labels
    families = {f.name: f for f in text_string_to_metric_families(text)}
    drift = "eventdrop_reconciliation_drift_ratio"
    assert sample(families, drift, provider="stripe", source="stripe") == pytest.approx(0.00002)
    # github: the worst scope that measured anything (the other failed)
    assert sample(families, drift, provider="github", source="github") == pytest.approx(0.0002)
    finished = "eventdrop_reconciliation_last_finished_timestamp_seconds"
    expected = (now - timedelta(hours=1)).timestamp()
    assert sample(families, finished, provider="stripe", source="stripe") == pytest.approx(expected)


def test_lag_gauges_are_absent_without_events(client, token):
    families = scrape(client, **bearer(TOKEN))
    assert families["eventdrop_verification_lag_p95_seconds"].samples == []
    assert families["eventdrop_processing_lag_p95_seconds"].samples == []
    assert sample(families, "eventdrop_raw_events_oldest_pending_age_seconds") == 0


def test_replica_gauges_are_declared_without_samples_when_there_is_no_replica(client, token):
    # With a replica they are read from it: tests/faults/test_replica.py, a real one.
    families = scrape(client, **bearer(TOKEN))
    for name in ("up", "lag_seconds", "max_lag_seconds", "serving_reads"):
        assert families[f"eventdrop_replica_{name}"].samples == [], name


def test_label_values_come_only_from_closed_sets(client, token):
    from django.utils import timezone

    now = timezone.now()
    RawEvent.objects.bulk_create(
        [
            # a source no longer configured, a reason outside the enum, a telling body
            raw_event(
                now,
                source="retired-partner",
                ago=timedelta(minutes=1),
                status="rejected",
                reason="something_new",
                body=b'{"card": "TOPSECRET-4242"}',
            ),
        ]
    )
    response = client.get(METRICS, **bearer(TOKEN))
    text = response.content.decode()
    assert "retired-partner" not in text and "something_new" not in text
    assert "TOPSECRET" not in text and "never-exported" not in text
    assert TOKEN not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    rejected = "eventdrop_raw_events_rejected_last_24h"
    assert sample(families, rejected, source="other", reason="other") == 1
    allowed = {
        "source": {*all_sources(), "other"},
        "reason": {*RejectionReason.values, "other"},
    }
    for family in families.values():
        for s in family.samples:
            for label in ("source", "reason"):
                if label in s.labels:
                    assert s.labels[label] in allowed[label], s


def ack_count(families: dict, source: str = "stripe") -> float:
    """Acknowledged webhooks so far (the histogram is process-wide, so tests compare)."""
    family = families.get(ACK)
    if family is None:
        return 0
    return sum(
        s.value
        for s in family.samples
        if s.name == f"{ACK}_count" and s.labels == {"source": source}
    )


def test_acknowledged_webhooks_show_in_the_histogram(client, token):
    before = scrape(client, **bearer(TOKEN))
    response = client.generic(
        "POST", "/webhooks/stripe/", b"{}", content_type="application/json", **STRIPE_HEADERS
    )
    assert response.status_code == 202
    after = scrape(client, **bearer(TOKEN))
    assert ack_count(after) == ack_count(before) + 1
    assert sample(after, ACK, "_bucket", source="stripe", le="+Inf") == ack_count(after)


def test_multiprocess_mode_merges_every_worker_process(client, token, tmp_path, monkeypatch):
    """With PROMETHEUS_MULTIPROC_DIR each worker writes its own file; a scrape served by any
    one of them reads them all (and the ops page's ACK p99 does too)."""
    from console.ops.figures import ack_latency

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    buckets = (0.005, 0.25, 0.5)
    for pid, seconds in ((101, 0.004), (102, 0.004), (102, 0.3)):
        # What each gunicorn worker's copy of the receive view's histogram does.
        value_class = values.MultiProcessValue(lambda pid=pid: pid)
        monkeypatch.setattr(values, "ValueClass", value_class)
        worker_histogram = Histogram(ACK, "ACK", ["source"], buckets=buckets, registry=None)
        worker_histogram.labels(source="stripe").observe(seconds)
        value_class.close_all_files()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["histogram_101.db", "histogram_102.db"]

    families = scrape(client, **bearer(TOKEN))
    assert sample(families, ACK, "_count", source="stripe") == 3
    assert sample(families, ACK, "_bucket", source="stripe", le="0.005") == 2
    assert sample(families, ACK, "_sum", source="stripe") == pytest.approx(0.308)
    assert "eventdrop_raw_events_pending" in families  # the database figures as well
    assert ack_latency().count == 3


def test_side_effects_waiting_by_reason(client, token, admin_user):
    from outbox.models import RecapSideEffect
    from tests.console.samples import paid_recap

    rows = [RecapSideEffect.objects.get(recap=paid_recap(client, admin_user)) for _ in range(4)]
    for row, reason in zip(rows, ["breaker", "breaker", "own_error", "configuration"], strict=True):
        RecapSideEffect.objects.filter(pk=row.pk).update(wait_reason=reason)
    families = scrape(client, **bearer(TOKEN))
    waiting = "eventdrop_side_effects_waiting"
    assert sample(families, waiting, wait_reason="breaker") == 2
    assert sample(families, waiting, wait_reason="own_error") == 1
    assert sample(families, waiting, wait_reason="configuration") == 1
