"""reconcile_stripe against a local fake Stripe API, with the real SDK and the real pipeline."""

import json
from collections import Counter
from datetime import timedelta

import pytest
from django.core.management import CommandError
from django.utils import timezone

from ingress.inbox import inbox_run_once
from ingress.models import DispatchStatus, RawEvent, ReconciliationRun, SignatureStatus
from ingress.reconcile.errors import (
    AUTH_REFUSED,
    NOT_TLS,
    PAGE_LIMIT,
    PERMISSION_DENIED,
    RATE_LIMITED,
    WINDOW_EMPTY,
)
from ingress.reconcile.selectors import provider_ids_classify
from ingress.reconcile.window import CLAMPED_START, iso
from outbox.models import RecapSideEffect
from recaps.models import RecapStatus
from tests.ingress.reconcile.conftest import STRIPE_TYPE, receive_stripe, run
from tests.recaps.factories import RecapFactory

pytestmark = pytest.mark.django_db


def add_events(stripe_api, count, *, hours_ago=2, event_type=STRIPE_TYPE):
    now = timezone.now()
    return [
        stripe_api.add_event(event_type, created=now - timedelta(hours=hours_ago, seconds=n))
        for n in range(count)
    ]


def test_missing_events_are_backfilled_once_and_reach_their_handlers(
    client, stripe_api, stripe_handler
):
    events = add_events(stripe_api, 6)
    # Not a type the endpoint receives: listed by Stripe, never compared.
    add_events(stripe_api, 2, event_type="customer.updated")
    for event in events[:2]:
        receive_stripe(client, event)
    inbox_run_once()
    pending = receive_stripe(client, events[2])  # received, not yet verified: not missing
    missing = events[3:]

    output = run("reconcile_stripe")

    record = ReconciliationRun.objects.get()
    assert (record.provider, record.source, record.status) == ("stripe", "stripe", "complete")
    counts = (
        record.provider_count,
        record.known_count,
        record.pending_count,
        record.missing_count,
        record.backfilled_count,
    )
    assert counts == (6, 2, 1, 3, 3)
    assert record.drift == pytest.approx(0.5)
    assert record.missing_ids == [e["id"] for e in missing]
    assert record.pages == 1 and record.finished_at is not None
    assert (
        f"stripe reconciliation #{record.id} complete: window {iso(record.window_start)} → "
        f"{iso(record.window_end)}, 1 page(s); Stripe listed 6, known 2, pending 1, missing 3, "
        "backfilled 3; drift 50.0000 % (SLO 0.0100 %, OVER SLO)"
    ) in output
    assert all(f"missing: {e['id']} {STRIPE_TYPE} created" in output for e in missing)
    (listed,) = stripe_api.list_requests
    assert listed["query"]["types[0]"] == STRIPE_TYPE

    backfilled = list(RawEvent.objects.filter(origin="backfilled").order_by("id"))
    assert [json.loads(bytes(row.body)) for row in backfilled] == missing
    for row, event in zip(backfilled, missing, strict=True):
        assert (row.method, row.path, row.remote_addr) == ("GET", f"/v1/events/{event['id']}", None)
        assert row.headers == {"content-type": "application/json", "request-id": "req_fake"}
        assert row.signature_status == SignatureStatus.PENDING

    inbox_run_once()
    for row in backfilled:
        row.refresh_from_db()
        assert row.signature_status == SignatureStatus.VERIFIED
        assert row.matched_secret_index is None  # verified by fetch: no secret matched
        assert row.dispatch_status == DispatchStatus.DISPATCHED
        assert row.dedup_key == f"id:{json.loads(bytes(row.body))['id']}"
    pending.refresh_from_db()
    assert pending.signature_status == SignatureStatus.VERIFIED

    second = run("reconcile_stripe")
    again = ReconciliationRun.objects.exclude(pk=record.pk).get()
    assert (again.known_count, again.missing_count, again.backfilled_count) == (6, 0, 0)
    assert again.drift == 0
    assert "drift 0.0000 % (SLO 0.0100 %, within SLO)" in second
    assert RawEvent.objects.filter(origin="backfilled").count() == 3
    assert Counter(stripe_handler.calls) == {e["id"]: 1 for e in events}


def test_a_webhook_arriving_after_the_backfill_is_its_duplicate(client, stripe_api, stripe_handler):
    (event,) = add_events(stripe_api, 1)
    run("reconcile_stripe")
    inbox_run_once()
    late = receive_stripe(client, event)  # Stripe's own retry, after all
    inbox_run_once()

    backfilled = RawEvent.objects.get(origin="backfilled")
    late.refresh_from_db()
    assert late.dispatch_status == DispatchStatus.DUPLICATE
    assert late.duplicate_of_id == backfilled.id
    assert stripe_handler.calls == [event["id"]]


def test_a_backfilled_checkout_pays_its_recap_through_the_real_handler(
    client, stripe_api, settings
):
    settings.RECONCILE_STRIPE_EVENT_TYPES = []  # default: the types our handlers take
    recap = RecapFactory.create()
    session = {
        "id": "cs_test_backfill",
        "object": "checkout.session",
        "metadata": {"recap_id": str(recap.id)},
        "payment_status": "paid",
        "payment_intent": "pi_backfilled",
    }
    stripe_api.add_event(
        "checkout.session.completed", created=timezone.now() - timedelta(hours=1), data=session
    )

    run("reconcile_stripe")
    inbox_run_once()

    recap.refresh_from_db()
    assert (recap.status, recap.payment_reference) == (RecapStatus.PAID, "pi_backfilled")
    assert RecapSideEffect.objects.filter(recap=recap).count() == 1
    query = stripe_api.list_requests[0]["query"]
    listed_types = {v for k, v in query.items() if k.startswith("types[")}
    assert "checkout.session.completed" in listed_types


def test_dry_run_lists_and_changes_nothing(stripe_api):
    events = add_events(stripe_api, 2)

    output = run("reconcile_stripe", "--dry-run")

    assert "stripe reconciliation (dry run, nothing changed) complete" in output
    assert "missing 2, would backfill 2; drift 100.0000 %" in output
    assert all(f"missing: {e['id']}" in output for e in events)
    assert not RawEvent.objects.exists()
    assert not ReconciliationRun.objects.exists()


def test_the_window_is_clamped_to_stripes_30_days_and_says_so(stripe_api):
    now = timezone.now()
    asked = now - timedelta(days=40)

    output = run("reconcile_stripe", "--since", asked.isoformat())

    record = ReconciliationRun.objects.get()
    clamped = record.window_start
    assert abs((clamped - (now - timedelta(days=30))).total_seconds()) < 5
    note = CLAMPED_START.format(
        requested=iso(asked), days=30, provider="Stripe", clamped=iso(clamped)
    )
    assert f"note: {note}" in output
    assert note in record.notes
    (listed,) = stripe_api.list_requests
    assert int(listed["query"]["created[gte]"]) == int(clamped.timestamp())
    assert int(listed["query"]["created[lt]"]) == int(record.window_end.timestamp())


def test_a_future_end_is_clamped_to_now_and_an_empty_window_refused(stripe_api):
    output = run("reconcile_stripe", "--until", (timezone.now() + timedelta(days=1)).isoformat())
    assert "is in the future: clamped to now" in output

    since, until = timezone.now() - timedelta(hours=1), timezone.now() - timedelta(hours=2)
    with pytest.raises(CommandError) as refused:
        run("reconcile_stripe", "--since", since.isoformat(), "--until", until.isoformat())
    assert str(refused.value) == WINDOW_EMPTY.format(since=iso(since), until=iso(until))
    with pytest.raises(CommandError, match="ISO 8601"):
        run("reconcile_stripe", "--since", "yesterday")
    with pytest.raises(CommandError, match="with a zone"):
        run("reconcile_stripe", "--since", "2026-11-01T00:00:00")
    assert ReconciliationRun.objects.count() == 1


def test_pagination_follows_starting_after_across_pages(stripe_api):
    events = add_events(stripe_api, 250)

    run("reconcile_stripe")

    record = ReconciliationRun.objects.get()
    assert (record.pages, record.provider_count, record.backfilled_count) == (3, 250, 250)
    cursors = [r["query"].get("starting_after") for r in stripe_api.list_requests]
    assert cursors == [None, events[99]["id"], events[199]["id"]]
    assert all(r["query"]["limit"] == "100" for r in stripe_api.list_requests)
    assert RawEvent.objects.filter(origin="backfilled").count() == 250


def test_the_page_limit_stops_the_run_incomplete_keeping_its_work(stripe_api, settings):
    settings.RECONCILE_MAX_PAGES = 2
    add_events(stripe_api, 250)

    output = run("reconcile_stripe")

    record = ReconciliationRun.objects.get()
    assert (record.status, record.pages, record.backfilled_count) == ("incomplete", 2, 200)
    assert record.error == PAGE_LIMIT.format(pages=2)
    assert record.drift == 1.0
    assert PAGE_LIMIT.format(pages=2) in output
    assert len(stripe_api.list_requests) == 2


@pytest.mark.parametrize(
    ("switch", "message"),
    [
        (
            "bad_key",
            AUTH_REFUSED.format(provider="Stripe", status=401, setting="STRIPE_API_KEY"),
        ),
        (
            "forbidden",
            PERMISSION_DENIED.format(
                provider="Stripe",
                status=403,
                setting="STRIPE_API_KEY",
                needed="to read Events (a restricted key needs Events: read)",
            ),
        ),
    ],
)
def test_refused_credentials_fail_the_run_with_a_clear_error(stripe_api, settings, switch, message):
    add_events(stripe_api, 3)
    if switch == "bad_key":
        settings.STRIPE_API_KEY = "sk_test_not_ours"
    else:
        stripe_api.forbidden = True

    with pytest.raises(CommandError) as failed:
        run("reconcile_stripe")

    assert str(failed.value) == message and failed.value.returncode == 1
    record = ReconciliationRun.objects.get()
    assert (record.status, record.error, record.drift) == ("failed", message, None)
    assert "sk_test" not in record.error
    assert not RawEvent.objects.exists()


def test_a_rate_limit_stops_the_run_incomplete_with_what_was_done(stripe_api):
    add_events(stripe_api, 150)
    stripe_api.rate_limit_from_request = 2

    output = run("reconcile_stripe")

    record = ReconciliationRun.objects.get()
    expected = RATE_LIMITED.format(provider="Stripe", status=429, wait="", pages=1)
    assert (record.status, record.error) == ("incomplete", expected)
    assert (record.pages, record.provider_count, record.backfilled_count) == (1, 100, 100)
    assert expected in output
    assert RawEvent.objects.filter(origin="backfilled").count() == 100


def test_a_plain_http_api_base_is_refused_before_any_call(stripe_api, settings):
    settings.STRIPE_API_BASE = "http://api.stripe.example"
    add_events(stripe_api, 1)

    with pytest.raises(CommandError) as failed:
        run("reconcile_stripe")

    assert str(failed.value) == NOT_TLS.format(
        setting="STRIPE_API_BASE",
        url="http://api.stripe.example",
        purpose="fetch events that will be trusted without a signature",
    )
    assert not stripe_api.list_requests
    assert ReconciliationRun.objects.get().status == "failed"


def test_without_an_api_key_the_run_fails_visibly(settings):
    settings.STRIPE_API_KEY = ""
    with pytest.raises(CommandError, match="STRIPE_API_KEY is not set"):
        run("reconcile_stripe")
    assert ReconciliationRun.objects.get().status == "failed"


def test_an_event_verified_while_being_classified_is_not_missing(client, stripe_api):
    """The race the second look at the dedup index exists for."""
    (event,) = add_events(stripe_api, 1)
    receive_stripe(client, event)

    def verified_meanwhile(candidates):
        inbox_run_once()  # leaves `pending` for the dedup index between the two looks
        return set()

    classified = provider_ids_classify(
        source="stripe", provider_ids=[event["id"]], pending_among=verified_meanwhile
    )
    assert (classified.known, classified.missing) == ({event["id"]}, [])
