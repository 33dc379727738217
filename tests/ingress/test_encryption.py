"""Raw event bodies encrypted at rest (issue 12): RAW_EVENT_ENCRYPTION_KEYS on PostgreSQL.

Through the real receive view, the real inbox, the real rotation command and the real
console (admin and API): the stored column is ciphertext, the signature verifies on the
decrypted bytes, dedup compares plaintext, an old key still decrypts after a rotation and
the rotation rewrites every body under the new one, a key that does not parse is a check
error, a key we no longer hold leaves the row pending (never charged), and only the payload
permission sees the decrypted body. Body search is refused, with its reason, not empty.
"""

import hashlib
import json

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.urls import reverse
from rest_framework.test import APIClient

from console.raw_events.selectors import BODY_SEARCH_ENCRYPTED
from ingress.checks import check_raw_event_encryption_keys
from ingress.deliveries import deliveries_run_due
from ingress.encryption import BodyUndecryptable, key_id
from ingress.inbox import dedup_key_for, inbox_run_once, raw_events_verify_batch
from ingress.models import Delivery, RawEvent
from ingress.payloads import raw_event_body, raw_event_headers
from ingress.verifiers import Verdict
from tests.console import conftest as console_fixtures
from tests.ingress import test_inbox
from tests.ingress.test_inbox import receive_github

pytestmark = pytest.mark.django_db

# Fixtures: a registered `push` handler; staff with and without ingress.view_raw_payload.
push_handler = test_inbox.push_handler
operator = console_fixtures.operator
payload_operator = console_fixtures.payload_operator

KEY_1 = Fernet.generate_key().decode()
KEY_2 = Fernet.generate_key().decode()
MARKER = "refs/heads/encryption-needle"


@pytest.fixture
def keys(settings):
    def use(*keys: str) -> None:
        settings.RAW_EVENT_ENCRYPTION_KEYS = list(keys)

    use(KEY_1)
    return use


def stored_headers(event_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT headers::text FROM ingress_rawevent WHERE id = %s", [event_id])
        return cursor.fetchone()[0]


def stored_column(event_id: int) -> tuple[bytes, str]:
    """What PostgreSQL holds, read past the ORM."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT body, body_encryption FROM ingress_rawevent WHERE id = %s", [event_id]
        )
        body, scheme = cursor.fetchone()
    return bytes(body), scheme


def receive(client, delivery="enc-1") -> tuple[RawEvent, bytes]:
    payload = {"ref": MARKER, "delivery": delivery}
    return receive_github(client, payload, delivery=delivery), json.dumps(payload).encode()


def test_received_body_is_stored_encrypted_and_verified_on_the_plaintext(
    client, keys, push_handler
):
    event, plaintext = receive(client)
    stored, scheme = stored_column(event.pk)
    assert scheme == key_id(KEY_1)
    assert MARKER.encode() not in stored and stored != plaintext
    # The headers too: the signature and the delivery id are not in the column.
    assert "x-hub-signature-256" not in stored_headers(event.pk)
    assert "enc-1" not in stored_headers(event.pk)
    event.refresh_from_db()
    assert event.body_sha256 == hashlib.sha256(plaintext).hexdigest()
    assert raw_event_body(event) == plaintext
    headers = raw_event_headers(event)
    assert headers["x-github-delivery"] == "enc-1" and event.delivery_id == "enc-1"
    assert headers["x-hub-signature-256"].startswith("sha256=")

    inbox_run_once()
    event.refresh_from_db()
    # The GitHub signature was computed over the plaintext: it verifies only on it.
    assert (event.signature_status, event.dispatch_status) == ("verified", "dispatched")
    assert [payload["ref"] for _, payload in push_handler.calls] == [MARKER]


def test_dedup_compares_plaintext_not_ciphertext(client, keys, push_handler):
    first, _ = receive(client, delivery="enc-dup")
    second, _ = receive(client, delivery="enc-dup")
    assert stored_column(first.pk)[0] != stored_column(second.pk)[0]  # a fresh IV each
    raw_events_verify_batch()
    second.refresh_from_db()
    assert (second.dispatch_status, second.duplicate_of_id) == ("duplicate", first.pk)
    # The content-hash fallback key too (no provider id): same plaintext, same key.
    first.refresh_from_db()
    no_id = Verdict(event_type="push")
    assert dedup_key_for(first, no_id) == dedup_key_for(second, no_id)


def test_rotation_old_key_still_decrypts_and_the_command_rewrites_under_the_new(
    client, keys, settings, push_handler
):
    settings.RAW_EVENT_ENCRYPTION_KEYS = []
    plain, plain_body = receive(client, delivery="enc-plain")  # stored before encryption
    keys(KEY_1)
    old, old_body = receive(client, delivery="enc-old")
    keys(KEY_2, KEY_1)  # the new key first, the old one still decrypts
    new, new_body = receive(client, delivery="enc-new")
    assert [stored_column(e.pk)[1] for e in (plain, old, new)] == [
        "",
        key_id(KEY_1),
        key_id(KEY_2),
    ]
    old.refresh_from_db()
    assert raw_event_body(old) == old_body

    call_command("rotate_raw_event_keys", batch_size=1)
    assert {stored_column(e.pk)[1] for e in (plain, old, new)} == {key_id(KEY_2)}
    keys(KEY_2)  # the old key dropped: everything still reads
    for event, body in ((plain, plain_body), (old, old_body), (new, new_body)):
        event.refresh_from_db()
        assert raw_event_body(event) == body
        assert raw_event_headers(event)["x-github-event"] == "push"
        assert "x-github-event" not in stored_headers(event.pk)
    inbox_run_once()
    assert set(RawEvent.objects.values_list("signature_status", flat=True)) == {"verified"}

    keys("plaintext", KEY_2)  # turning encryption off: decrypt with the key, write plaintext
    call_command("rotate_raw_event_keys")
    assert stored_column(old.pk) == (old_body, "")
    assert json.loads(stored_headers(old.pk))["x-github-delivery"] == "enc-old"


def test_a_key_that_does_not_parse_is_a_check_error(settings):
    settings.RAW_EVENT_ENCRYPTION_KEYS = [KEY_1, "not-a-fernet-key"]
    [error] = check_raw_event_encryption_keys()
    assert error.id == "ingress.E004"
    assert "entry 2 is not a Fernet key" in error.msg
    assert "not-a-fernet-key" not in error.msg  # a key never goes into a message
    settings.RAW_EVENT_ENCRYPTION_KEYS = [KEY_1, KEY_1]
    assert "the same key twice" in check_raw_event_encryption_keys()[0].msg
    settings.RAW_EVENT_ENCRYPTION_KEYS = ["plaintext", KEY_1]
    assert check_raw_event_encryption_keys() == []


def test_a_missing_key_leaves_the_row_pending_uncharged_and_says_why(client, keys):
    event, _ = receive(client)
    keys(KEY_2)  # KEY_1 was dropped too early
    event.refresh_from_db()
    with pytest.raises(BodyUndecryptable, match="not among the configured keys"):
        raw_event_body(event)
    assert raw_events_verify_batch() == 0  # not claimed: our configuration, not the row
    event.refresh_from_db()
    assert (event.signature_status, event.processing_failures) == ("pending", 0)
    with pytest.raises(CommandError, match="1 bodies are encrypted with a key"):
        call_command("rotate_raw_event_keys")
    assert stored_column(event.pk)[1] == key_id(KEY_1)  # left as it was
    keys(KEY_2, KEY_1)  # the key is back: the row goes on
    assert raw_events_verify_batch() == 1


def test_a_damaged_ciphertext_is_charged_like_any_poison_row(client, keys):
    event, _ = receive(client)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ingress_rawevent SET body = %s WHERE id = %s", [b"\x00" * 80, event.pk]
        )
    raw_events_verify_batch()
    event.refresh_from_db()
    assert (event.signature_status, event.processing_failures) == ("pending", 1)
    assert event.processing_error == "BodyUndecryptable in verify/dedup/dispatch"


def test_console_shows_the_decrypted_body_to_the_payload_permission_only(
    client,
    keys,
    operator,
    payload_operator,
):
    event, plaintext = receive(client)
    page = reverse("admin:ingress_rawevent_change", args=[event.pk])
    download = reverse("admin:ingress_rawevent_raw_body", args=[event.pk])
    client.force_login(payload_operator)
    assert MARKER in client.get(page).content.decode()
    assert client.get(download).content == plaintext
    api = APIClient()
    api.force_authenticate(payload_operator)
    detail = api.get(f"/api/raw-events/{event.pk}/").json()
    assert detail["body"]["data"] == plaintext.decode()
    assert detail["headers"]["x-github-delivery"] == "enc-1"
    assert "x-hub-signature-256" in client.get(page).content.decode()

    client.force_login(operator)
    assert MARKER not in client.get(page).content.decode()
    assert client.get(download).status_code == 404
    api.force_authenticate(operator)
    detail = api.get(f"/api/raw-events/{event.pk}/").json()
    assert "body" not in detail and MARKER not in json.dumps(detail)


def test_body_search_is_refused_with_its_reason_not_empty(client, keys, payload_operator):
    event, _ = receive(client)
    api = APIClient()
    api.force_authenticate(payload_operator)
    response = api.get("/api/raw-events/", {"body_contains": "encryption-needle"})
    assert response.status_code == 400
    assert response.json()["errors"]["body_contains"] == [BODY_SEARCH_ENCRYPTED]
    # q still finds by id, and the admin says why bodies were not searched.
    assert [
        r["id"] for r in api.get("/api/raw-events/", {"q": f"#{event.pk}"}).json()["results"]
    ] == [event.pk]
    client.force_login(payload_operator)
    response = client.get("/admin/ingress/rawevent/", {"body": "encryption-needle"})
    assert response.status_code == 200
    assert BODY_SEARCH_ENCRYPTED in [str(m) for m in response.context["messages"]]


def test_a_delivery_under_a_dropped_key_waits_uncharged_instead_of_dying(
    client, keys, settings, push_handler
):
    receive(client)
    raw_events_verify_batch()
    keys(KEY_2)  # dropped after verification, before the handler ran
    settings.DELIVERY_MAX_ATTEMPTS = 1
    assert deliveries_run_due() == 0
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.total_attempts) == ("pending", 0, 0)
    assert push_handler.calls == []
    keys(KEY_2, KEY_1)  # the key is back
    assert deliveries_run_due(now=delivery.next_attempt_at) == 1
    assert Delivery.objects.get().status == "done"
