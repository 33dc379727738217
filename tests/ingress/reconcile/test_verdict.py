"""Backfilled events are verified by fetch; nothing received can pass for one."""

import hashlib
import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from ingress.inbox import inbox_run_once
from ingress.models import (
    RawEvent,
    RawEventOrigin,
    ReconciliationRun,
    RejectionReason,
    SignatureStatus,
)
from ingress.reconcile.services import FetchedEvent, raw_events_backfill
from ingress.sources import all_sources
from tests.ingress.reconcile.conftest import STRIPE_TYPE, run

pytestmark = pytest.mark.django_db


def backfill(body: dict | bytes, *, source: str = "stripe") -> RawEvent:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    (row,) = raw_events_backfill(
        source=all_sources()[source],
        events=[FetchedEvent("evt_x", raw, "/v1/events/evt_x", {"request-id": "req_1"})],
    )
    return row


def verdict_of(row: RawEvent) -> RawEvent:
    inbox_run_once()
    row.refresh_from_db()
    return row


def test_a_received_request_is_always_received_whatever_it_claims(client):
    body = json.dumps({"id": "evt_forged", "object": "event", "type": STRIPE_TYPE}).encode()
    response = client.post(
        "/webhooks/stripe/",
        body,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE="t=1,v1=" + "0" * 64,
        HTTP_X_EVENTDROP_ORIGIN="backfilled",
        HTTP_ORIGIN="backfilled",
    )
    assert response.status_code == 202

    row = verdict_of(RawEvent.objects.get(pk=response.json()["id"]))

    assert row.origin == RawEventOrigin.RECEIVED
    assert row.signature_status == SignatureStatus.REJECTED


def test_a_backfilled_event_is_verified_without_a_secret_and_keyed_by_its_id():
    row = verdict_of(backfill({"id": "evt_1", "object": "event", "type": STRIPE_TYPE}))

    assert (row.signature_status, row.matched_secret_index) == (SignatureStatus.VERIFIED, None)
    assert (row.event_type, row.dedup_key) == (STRIPE_TYPE, "id:evt_1")
    assert row.body_sha256 == hashlib.sha256(bytes(row.body)).hexdigest()


def test_it_is_verified_even_with_no_webhook_secret_configured(monkeypatch):
    monkeypatch.setenv("STRIPE_WEBHOOK_SECRET", "")
    all_sources.cache_clear()
    try:
        row = verdict_of(backfill({"id": "evt_2", "object": "event", "type": STRIPE_TYPE}))
    finally:
        monkeypatch.undo()
        all_sources.cache_clear()
    assert row.signature_status == SignatureStatus.VERIFIED


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        {"object": "event", "type": STRIPE_TYPE},  # no id
        {"id": "cus_1", "object": "customer"},  # not an event
    ],
)
def test_a_backfilled_body_must_still_be_a_stripe_event(body):
    row = verdict_of(backfill(body))
    assert (row.signature_status, row.rejection_reason) == (
        SignatureStatus.REJECTED,
        RejectionReason.UNPARSEABLE_BODY,
    )


def test_only_providers_we_backfill_from_are_trusted_by_fetch():
    row = verdict_of(backfill({"id": "evt_3", "object": "event"}, source="github"))
    assert row.rejection_reason == RejectionReason.VERIFIER_ERROR


def test_the_console_tells_backfilled_from_received(admin_client, client):
    received = RawEvent.objects.create(
        source="stripe",
        provider="stripe",
        method="POST",
        path="/webhooks/stripe/",
        headers={},
        body=b"{}",
        body_sha256="0" * 64,
    )
    fetched = verdict_of(backfill({"id": "evt_4", "object": "event", "type": STRIPE_TYPE}))

    listing = admin_client.get(reverse("admin:ingress_rawevent_changelist") + "?origin=backfilled")

    assert listing.status_code == 200
    shown = {row.pk for row in listing.context["cl"].result_list}
    assert fetched.pk in shown and received.pk not in shown
    assert received.origin == RawEventOrigin.RECEIVED
    assert fetched.get_origin_display() == "backfilled (fetched from the provider's API)"


def test_the_run_admin_links_to_the_events_it_backfilled(admin_client, stripe_api):
    stripe_api.add_event(STRIPE_TYPE, created=timezone.now() - timedelta(hours=1))
    run("reconcile_stripe")
    record = ReconciliationRun.objects.get()

    page = admin_client.get(reverse("admin:ingress_reconciliationrun_change", args=[record.pk]))
    link = page.content.decode().split('href="')
    url = next(part.split('"')[0] for part in link if "origin=backfilled" in part)
    listing = admin_client.get(url.replace("&amp;", "&"))

    assert listing.status_code == 200
    assert [row.origin for row in listing.context["cl"].result_list] == ["backfilled"]
    assert "100.0000 % (over the SLO of 0.0100 %)" in page.content.decode()
