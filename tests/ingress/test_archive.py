"""Archive before drop, and restore (ingress/archive.py), against a real S3 API.

moto's server mode (`moto_server`, from PyPI) runs as a subprocess on a free 127.0.0.1 port
for the module; the code under test talks to it through django-storages and boto3 exactly
as it would to S3. The partitions are real (PostgreSQL, DDL, `transactional_db`). About 5 s.
"""

import gzip
import hashlib
import io
import json
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

import boto3
import pytest
from django.core.checks import run_checks
from django.core.files import File
from django.core.management import CommandError, call_command

from ingress.models import Delivery, RawEvent
from ingress.partitions import partition_name, raw_event_partitions_maintain
from tests.ingress.test_partitions import NOW, OLD, attached, make_event, pg, with_dependents
from tests.support.processes import free_port

pytestmark = pytest.mark.slow

__all__ = ["pg"]  # the fixture, imported for its use below

BUCKET = "eventdrop-archive"
MOTO_SERVER = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "moto_server"
OLD_DAY = OLD.date()


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    port = free_port()
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("wb")
    process = subprocess.Popen(
        [str(MOTO_SERVER), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


@pytest.fixture
def s3(s3_endpoint, settings, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    settings.RAW_EVENT_ARCHIVE_ENABLED = True
    settings.RAW_EVENT_ARCHIVE_BUCKET = BUCKET
    settings.RAW_EVENT_ARCHIVE_PREFIX = "raw-events"
    settings.AWS_S3_ENDPOINT_URL = s3_endpoint
    settings.AWS_S3_REGION_NAME = "us-east-1"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=BUCKET)
    yield client
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=BUCKET)


def old_events() -> list[RawEvent]:
    """One day past retention: bytes no text codec round-trips, a ciphertext under a key id,
    headers with non-ASCII text, two sources."""
    return [
        make_event(
            OLD,
            event_type="checkout.session.completed",
            body=b'{"id": "evt_a", "name": "J\xc3\xbcrgen"}\n',
            body_sha256="a" * 64,
            headers={"stripe-signature": "t=1,v1=ab", "x-note": "caf\u00e9 \u2713"},
        ),
        make_event(
            OLD + timedelta(hours=5),
            event_type="invoice.paid",
            body=bytes(range(256)),
            body_encryption="fernet:0123abcd",
            body_sha256="b" * 64,
        ),
        make_event(
            OLD + timedelta(hours=7),
            status="rejected",
            source="github",
            provider="github",
            event_type="push",
            body=b"payload=%7B%7D",
            body_sha256="c" * 64,
            headers={"content-type": "application/x-www-form-urlencoded"},
        ),
    ]


STORED = (
    "id",
    "source",
    "provider",
    "headers",
    "body_encryption",
    "body_sha256",
    "received_at",
    "signature_status",
    "rejection_reason",
    "event_type",
    "dispatch_status",
)


def snapshot(events) -> dict[int, tuple]:
    return {
        e.id: (bytes(e.body), *(getattr(e, name) for name in STORED))
        for e in RawEvent.objects.filter(id__in=[e.id for e in events])
    }


def run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def test_a_day_is_archived_verified_dropped_and_restored_byte_for_byte(pg, s3):
    events = old_events()
    with_dependents(events[0])
    before = snapshot(events)
    name = partition_name(OLD_DAY)

    result = raw_event_partitions_maintain(now=NOW)

    assert name in result.dropped and result.archived == {name: 3}
    assert name not in attached() and not RawEvent.objects.filter(id__in=before).exists()
    prefix = f"raw-events/{OLD_DAY:%Y/%m/%d}/"
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert keys == {prefix + f for f in ("github.ndjson.gz", "stripe.ndjson.gz", "manifest.json")}
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=prefix + "manifest.json")["Body"].read())
    assert manifest["events"] == 3 and manifest["body_encryption_keys"] == ["fernet:0123abcd"]
    for entry in manifest["files"]:
        stored = s3.get_object(Bucket=BUCKET, Key="raw-events/" + entry["name"])
        data = stored["Body"].read()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["bytes"]
        assert len(gzip.decompress(data).splitlines()) == entry["events"]

    # A subset first: one source, one event type, a time window.
    out = run(
        "restore_raw_events",
        OLD_DAY.isoformat(),
        "--source",
        "stripe",
        "--event-type",
        "invoice.paid",
        "--from",
        (OLD + timedelta(hours=1)).isoformat(),
    )
    assert "restore 1 events" in out
    assert set(RawEvent.objects.values_list("id", flat=True)) == {events[1].id}

    # Then the whole day: what is still there is skipped, the rest comes back exactly.
    out = run("restore_raw_events", OLD_DAY.isoformat())
    assert "restore 2 events" in out and "skipped 1 still in the store" in out
    assert snapshot(events) == before
    restored = RawEvent.objects.filter(id__in=before)
    assert {e.origin for e in restored} == {"restored"} and all(e.restored_at for e in restored)
    # Never delivered on its own: no delivery exists, and nothing is pending for the inbox.
    assert not Delivery.objects.filter(raw_event_id__in=before).exists()
    assert not restored.filter(signature_status="pending").exists()
    assert "restore 0 events" in run("restore_raw_events", OLD_DAY.isoformat())

    # The next run gives the day its partition back and keeps it while the restore is recent,
    # then drops it without archiving the restored rows again.
    manifest_before = s3.get_object(Bucket=BUCKET, Key=prefix + "manifest.json")["ETag"]
    result = raw_event_partitions_maintain(now=NOW)
    assert name in result.created and name in result.kept_restored
    result = raw_event_partitions_maintain(now=datetime.now(UTC) + timedelta(days=8))
    assert name in result.dropped and result.archived[name] == 0
    assert s3.get_object(Bucket=BUCKET, Key=prefix + "manifest.json")["ETag"] == manifest_before


def test_a_failed_upload_keeps_the_partition_and_the_command_fails(pg, s3, settings):
    events = old_events()
    with_dependents(events[0])
    before = snapshot(events)
    settings.RAW_EVENT_ARCHIVE_BUCKET = "no-such-bucket"
    out = StringIO()

    with pytest.raises(CommandError, match="1 partition"):
        call_command("raw_event_partitions", stdout=out)

    name = partition_name(OLD_DAY)
    assert f"keep {name}: ARCHIVE FAILED, not dropped (archive of {OLD_DAY}" in out.getvalue()
    assert name in attached() and snapshot(events) == before
    assert Delivery.objects.filter(raw_event_id=events[0].id).exists()  # dependents intact


def test_an_unreachable_endpoint_fails_within_its_bounds(pg, s3, settings):
    old_events()
    settings.AWS_S3_ENDPOINT_URL = f"http://127.0.0.1:{free_port()}"  # nothing listens
    settings.RAW_EVENT_ARCHIVE_CONNECT_TIMEOUT_SECONDS = 0.5
    settings.RAW_EVENT_ARCHIVE_MAX_ATTEMPTS = 2
    started = time.monotonic()
    result = raw_event_partitions_maintain(now=NOW)
    assert partition_name(OLD_DAY) in result.archive_failed
    assert partition_name(OLD_DAY) in attached()
    assert time.monotonic() - started < 15  # 2 tries, one pause of at most 6 s


def test_restoring_a_day_without_an_archive_names_it(pg, s3):
    with pytest.raises(CommandError, match="no archive of 2020-01-01"):
        call_command("restore_raw_events", "2020-01-01")


def test_the_archive_worst_case_is_held_against_the_maintenance_budget(settings):
    settings.RAW_EVENT_ARCHIVE_ENABLED = True
    settings.RAW_EVENT_ARCHIVE_BUCKET = BUCKET
    assert not [m for m in run_checks() if m.id in ("outbox.E001", "ingress.E005")]
    settings.RAW_EVENT_ARCHIVE_READ_TIMEOUT_SECONDS = 60.0
    errors = [m.msg for m in run_checks() if m.id == "outbox.E001"]
    assert len(errors) == 1 and "partition maintenance run" in errors[0]
    assert "RAW_EVENT_PARTITIONS_BUDGET_SECONDS" in errors[0]
    settings.RAW_EVENT_ARCHIVE_BUCKET = ""
    assert [m.id for m in run_checks() if m.id == "ingress.E005"] == ["ingress.E005"]


def test_the_archive_is_off_by_default_and_costs_the_budget_nothing(settings):
    from outbox.checks import OPERATIONS

    assert settings.RAW_EVENT_ARCHIVE_ENABLED is False
    assert OPERATIONS["ingress.archive_day"]().seconds == 0


def test_an_object_that_reads_back_different_keeps_the_partition(pg, s3, monkeypatch):
    # A store that keeps something other than what it was sent (here: the real moto server
    # given a truncated copy of each events file) is caught by the read-back.
    from storages.backends.s3 import S3Storage

    from ingress import archive

    class TruncatingStorage(S3Storage):
        def _save(self, name, content):
            if name.endswith(".ndjson.gz"):
                data = content.read()
                content = File(io.BytesIO(data[:-1]), name=name)
            return super()._save(name, content)

    real_storage = archive.archive_storage

    def truncating_storage():
        storage = real_storage()
        storage.__class__ = TruncatingStorage
        return storage

    monkeypatch.setattr(archive, "archive_storage", truncating_storage)
    events = old_events()
    before = snapshot(events)

    result = raw_event_partitions_maintain(now=NOW)

    name = partition_name(OLD_DAY)
    assert "reads back as" in result.archive_failed[name]
    assert name in attached() and snapshot(events) == before


def test_a_run_starts_no_archive_its_budget_cannot_cover(pg, s3, settings):
    events = old_events()
    settings.RAW_EVENT_PARTITIONS_BUDGET_SECONDS = 5.0  # below one day's worst case
    result = raw_event_partitions_maintain(now=NOW)
    name = partition_name(OLD_DAY)
    assert [step for step in result.deferred if step.startswith(f"archive {name}")]
    assert name in attached() and len(snapshot(events)) == 3
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET)


def test_a_dry_run_says_it_would_archive_first_and_writes_nothing(pg, s3):
    old_events()
    raw_event_partitions_maintain(now=NOW, retention_days=10_000)  # its partition, no drop
    out = run("raw_event_partitions", "--dry-run")
    assert f"would archive, verify and drop {partition_name(OLD_DAY)}" in out
    assert partition_name(OLD_DAY) in attached()
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET)


def test_an_encrypted_day_is_archived_as_ciphertext_and_reads_back_after_restore(pg, s3, settings):
    from cryptography.fernet import Fernet

    from ingress.encryption import encrypt_request
    from ingress.payloads import raw_event_body, raw_event_headers

    settings.RAW_EVENT_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    body, headers = b'{"id": "evt_secret_marker"}', {"stripe-signature": "t=1,v1=sig_marker"}
    stored_body, stored_headers, scheme = encrypt_request(body, headers)
    event = make_event(OLD, body=stored_body, headers=stored_headers, body_encryption=scheme)

    raw_event_partitions_maintain(now=NOW)

    prefix = f"raw-events/{OLD_DAY:%Y/%m/%d}/"
    archived = gzip.decompress(
        s3.get_object(Bucket=BUCKET, Key=prefix + "stripe.ndjson.gz")["Body"].read()
    )
    assert b"secret_marker" not in archived and b"sig_marker" not in archived
    run("restore_raw_events", OLD_DAY.isoformat())
    restored = RawEvent.objects.get(id=event.id)
    assert raw_event_body(restored) == body and raw_event_headers(restored) == headers
