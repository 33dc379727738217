"""The cap on payload bytes kept from requests that fail verification (issue 30,
ingress/rejected_payloads.py): junk is stored by the receive path (it cannot know yet), then
the inbox keeps at most INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE of it per source and minute
of arrival; past that, rows keep their metadata and lose body and headers."""

import json
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.db.models import Sum
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from ingress.inbox import inbox_run_once
from ingress.models import RawEvent, RejectedPayloadMinute
from ingress.payloads import raw_event_body
from ingress.rejected_payloads import payload_bytes
from ingress.services import raw_event_reverify
from tests.support.signing import github_headers

pytestmark = pytest.mark.django_db

KIB = 1024


def post_junk(client, body: bytes, *, delivery: str = "junk") -> RawEvent:
    headers = github_headers(body, secret="not-our-secret", delivery=delivery)
    response = client.post("/webhooks/github/", body, content_type="application/json", **headers)
    assert response.status_code == 202, response.content
    return RawEvent.objects.get(pk=response.json()["id"])


def drain() -> None:
    while not inbox_run_once().idle:
        pass


def test_past_the_cap_a_rejected_row_keeps_its_metadata_and_loses_its_payload(client, settings):
    bodies = [json.dumps({"junk": "x" * 3000, "n": n}).encode() for n in range(5)]
    events = [post_junk(client, body, delivery=f"junk-{n}") for n, body in enumerate(bodies)]
    # Room for two of them: the cap is in payload bytes, body and headers.
    settings.INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE = sum(payload_bytes(e) for e in events[:2])
    drain()

    for event in events:
        event.refresh_from_db()
        assert (event.signature_status, event.rejection_reason) == ("rejected", "bad_signature")
    kept, dropped = events[:2], events[2:]
    assert all(bytes(e.body) and e.headers and not e.payload_dropped_bytes for e in kept)
    for event, body in zip(dropped, bodies[2:], strict=True):
        assert bytes(event.body) == b"" and event.headers == {}
        assert event.payload_dropped_bytes > len(body)
        # What stays: enough to see and count the flood.
        assert event.delivery_id.startswith("junk-") and event.source == "github"
        assert event.remote_addr and len(event.body_sha256) == 64
        assert raw_event_body(event) == b""
    [minute] = RejectedPayloadMinute.objects.all()
    assert minute.kept_bytes == settings.INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE
    assert (minute.dropped, minute.dropped_bytes) == (
        3,
        sum(e.payload_dropped_bytes for e in dropped),
    )

    # /metrics counts them, per configured source.
    settings.METRICS_BEARER_TOKEN = "scrape-token-for-the-cap-0123456789"
    scraped = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.METRICS_BEARER_TOKEN}")
    counted = {
        sample.labels["source"]: sample.value
        for family in text_string_to_metric_families(scraped.content.decode())
        if family.name == "eventdrop_rejected_payloads_dropped"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert counted["github"] == 3 and counted["stripe"] == 0

    # Re-verifying stores nothing new: it neither counts nor drops.
    raw_event_reverify(raw_event=kept[0])
    kept[0].refresh_from_db()
    assert bytes(kept[0].body) == bodies[0]
    assert RejectedPayloadMinute.objects.get().dropped == 3


def test_signed_requests_are_never_capped(client, settings):
    settings.INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE = 0
    body = b'{"ref": "refs/heads/main"}'
    response = client.post(
        "/webhooks/github/", body, content_type="application/json", **github_headers(body)
    )
    drain()
    event = RawEvent.objects.get(pk=response.json()["id"])
    assert event.signature_status == "verified" and bytes(event.body) == body
    assert not RejectedPayloadMinute.objects.exists()


def test_each_minute_and_source_has_its_own_cap(client, settings):
    first, second = (post_junk(client, b'{"a": 1}', delivery=f"d{n}") for n in range(2))
    RawEvent.objects.filter(pk=second.pk).update(
        received_at=first.received_at + timedelta(minutes=1)
    )
    settings.INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE = payload_bytes(first)
    drain()
    assert not RawEvent.objects.filter(payload_dropped_bytes__gt=0).exists()
    assert RejectedPayloadMinute.objects.count() == 2


def test_an_encrypted_body_is_dropped_too(client, settings):
    from cryptography.fernet import Fernet

    settings.RAW_EVENT_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    settings.INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE = 0
    event = post_junk(client, b'{"junk": true}')
    assert event.body_encryption.startswith("fernet:")
    drain()
    event.refresh_from_db()
    assert event.payload_dropped_bytes and raw_event_body(event) == b""


# --- the flood --------------------------------------------------------------------------------

FLOOD_ROWS = 10_000
FLOOD_BODY = 256 * KIB
FLOOD_INSERT_ROWS = 1000  # per statement, each well inside the statement timeout


@pytest.fixture
def flood(settings) -> Iterator[datetime]:
    """10,000 junk requests of 256 KiB to one source, stored as the receive path stores them
    (one row each, pending, with a signature header that will not verify), within one
    minute. Inserted by one INSERT … SELECT that builds each body on the server, so the test
    does not push 2.5 GiB through the client: the inbox then reads every one of them."""
    settings.INBOX_BATCH_SIZE = 250  # the inbox's memory is not this test's subject
    template = RawEvent.objects.create(
        source="github",
        provider="github",
        method="POST",
        path="/webhooks/github/",
        headers={
            "content-type": "application/json",
            "x-hub-signature-256": "sha256=" + "0" * 64,
            "x-github-event": "push",
        },
        body=b"{}",
        body_sha256="0" * 64,
        remote_addr="203.0.113.9",
    )
    minute = timezone.now().replace(second=0, microsecond=0)
    quote = connection.ops.quote_name
    columns = [f.column for f in RawEvent._meta.concrete_fields if f.column != "id"]
    built = {
        # 256 KiB of JSON-looking text, different in every row.
        "body": f"convert_to(rpad('{{\"junk\": \"' || n, {FLOOD_BODY}, md5(n::text)), 'UTF8')",
        "received_at": "%s + n * interval '1 millisecond'",
        "delivery_id": "'flood-' || n",
    }
    select = ", ".join(built.get(column, quote(column)) for column in columns)
    with connection.cursor() as cursor:
        # lz4 rather than pglz for these bodies: building them is the test's cost, not its
        # subject (what the inbox reads back is the same 256 KiB).
        cursor.execute("SET LOCAL default_toast_compression = 'lz4'")
        for first in range(1, FLOOD_ROWS + 1, FLOOD_INSERT_ROWS):
            cursor.execute(
                f"INSERT INTO ingress_rawevent ({', '.join(quote(c) for c in columns)}) "  # noqa: S608
                f"SELECT {select} FROM ingress_rawevent, generate_series(%s::int, %s::int) AS n "
                "WHERE id = %s",
                [minute, first, first + FLOOD_INSERT_ROWS - 1, template.pk],
            )
    template.delete()
    yield minute


@pytest.mark.slow
def test_ten_thousand_junk_posts_grow_the_store_by_no_more_than_the_cap(flood, settings):
    """About 60 s (20 s to build the rows): the inbox reads and rejects 2.5 GiB of junk."""
    cap = settings.INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE
    junk = RawEvent.objects.filter(delivery_id__startswith="flood-")
    assert junk.count() == FLOOD_ROWS
    each = payload_bytes(junk[0])  # every row: 256 KiB of body, the same headers
    assert each > FLOOD_BODY
    drain()

    assert not junk.exclude(signature_status="rejected").exists()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(octet_length(body)), sum(octet_length(headers::text)) "
            "FROM ingress_rawevent WHERE delivery_id LIKE %s",
            ["flood-%"],
        )
        bodies, headers = cursor.fetchone()
    assert bodies + headers <= cap
    kept = junk.filter(payload_dropped_bytes=0).count()
    assert kept == cap // each  # the first ones, as long as they fit
    account = RejectedPayloadMinute.objects.get(source="github", minute=flood)
    assert (account.kept_bytes, account.dropped) == (kept * each, FLOOD_ROWS - kept)
    assert account.dropped_bytes == (FLOOD_ROWS - kept) * each
    assert junk.aggregate(total=Sum("payload_dropped_bytes"))["total"] == account.dropped_bytes
