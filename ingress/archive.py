"""Archives of raw events that outlive retention, on S3-compatible object storage.

Before raw_event_partitions drops a day's partition (ingress/partitions.py), `archive_day`
writes that day's events, one gzipped newline-delimited JSON file per source, plus a
manifest with each file's SHA-256, size and event count, and reads every object back to
compare it. Only a verified archive lets the drop go ahead; any failure (an S3 error, a
timeout, a mismatch) raises ArchiveFailed and the partition is kept for the next run.

Layout under RAW_EVENT_ARCHIVE_PREFIX in RAW_EVENT_ARCHIVE_BUCKET:

    <prefix>/2026/01/05/stripe.ndjson.gz     one line per event, ordered by id
    <prefix>/2026/01/05/manifest.json        written last: its presence means complete

A line holds every column of the row as stored (`body_base64` for the bytes, datetimes in
ISO 8601). Bodies (and headers) encrypted at rest are archived as the stored ciphertext
with their `body_encryption` key id, not decrypted: the archive is one more place with its
own access rules, and it must not hold readable payloads the database does not; the restore
then puts back exactly the row that was dropped, and reads go through ingress.payloads
(raw_event_body, raw_event_headers) as for any row. The price: a key may leave
RAW_EVENT_ENCRYPTION_KEYS only when no archive still needs it — the manifest lists the key
ids its events use.

`restore_archived_events` reads a day back (all of it, or by source, event type and time
window) into the store with origin `restored`: never settled or delivered on its own (the
inbox only claims pending rows, and a restored row keeps its verdict), replayable by an
operator, and skipped when its id is still in the store, so a second restore adds nothing.
Rows keep their ids, so duplicate_of and audit trails still point at them.

Every S3 call runs with botocore's connect and read timeouts and a bounded number of
attempts (RAW_EVENT_ARCHIVE_*); kernel/budgets.py computes the worst case of archiving one
day from them and the system check holds it against RAW_EVENT_PARTITIONS_BUDGET_SECONDS.
"""

import base64
import gzip
import hashlib
import io
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as time_of_day
from tempfile import SpooledTemporaryFile
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files import File
from django.core.files.storage import Storage
from django.db import connection, models, transaction
from django.db.models import QuerySet
from django.utils import timezone

from ingress.models import RawEvent, RawEventOrigin
from kernel.errors import EventDropError

if TYPE_CHECKING:  # botocore is imported only when the archive is used
    from botocore.config import Config

logger = logging.getLogger(__name__)

ARCHIVE_FORMAT = 1
MANIFEST_NAME = "manifest.json"
# Held by each restore batch: two restores of one day at once would both see an id as
# missing and insert it twice (the partitioned table cannot have a unique id).
RESTORE_LOCK_KEY = 0x696E_6772_6573_7372  # b"ingressr"
RESTORE_BATCH_SIZE = 500
_READ_CHUNK = 2000
# Bodies beyond this size spill from memory to a temporary file while a file is built.
_SPOOL_BYTES = 64 * 1024 * 1024


class ArchiveFailed(EventDropError):
    """The archive of a day could not be written or verified; its partition stays."""


@dataclass(frozen=True)
class ArchiveClientConfig:
    connect_timeout: float
    read_timeout: float
    max_attempts: int

    @classmethod
    def from_settings(cls) -> "ArchiveClientConfig":
        return cls(
            connect_timeout=float(settings.RAW_EVENT_ARCHIVE_CONNECT_TIMEOUT_SECONDS),
            read_timeout=float(settings.RAW_EVENT_ARCHIVE_READ_TIMEOUT_SECONDS),
            max_attempts=int(settings.RAW_EVENT_ARCHIVE_MAX_ATTEMPTS),
        )

    def botocore_config(self) -> "Config":
        from botocore.config import Config

        # "standard" retry mode: max_attempts counts the first try; its pause before retry n
        # is rand x min(2^(n-1), 20) s, raised by a server's x-amz-retry-after by at most 5 s
        # more (botocore.retries.standard.ExponentialBackoff): retry_pauses() takes the top.
        return Config(
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            retries={"mode": "standard", "max_attempts": self.max_attempts},
        )

    def retry_pauses(self) -> list[float]:
        return [min(20.0, 2.0 ** (n - 1)) + 5.0 for n in range(1, self.max_attempts)]

    def call_worst_case_seconds(self) -> float:
        return self.max_attempts * (self.connect_timeout + self.read_timeout) + sum(
            self.retry_pauses()
        )


def archive_enabled() -> bool:
    return bool(getattr(settings, "RAW_EVENT_ARCHIVE_ENABLED", False))


def archive_storage() -> Storage:
    """The archive's django-storages S3 backend, built from settings (module doc)."""
    from storages.backends.s3 import S3Storage

    return S3Storage(
        bucket_name=settings.RAW_EVENT_ARCHIVE_BUCKET,
        location=settings.RAW_EVENT_ARCHIVE_PREFIX,
        endpoint_url=settings.AWS_S3_ENDPOINT_URL,
        region_name=settings.AWS_S3_REGION_NAME,
        client_config=ArchiveClientConfig.from_settings().botocore_config(),
        # A re-run after a failed drop writes the same names again; never "name_abc123".
        file_overwrite=True,
        default_acl=None,
        querystring_auth=False,
    )


def _transient_errors() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError, OSError)


def day_prefix(day: date) -> str:
    return f"{day:%Y/%m/%d}"


def archive_file_name(day: date, source: str) -> str:
    return f"{day_prefix(day)}/{source}.ndjson.gz"


def manifest_name(day: date) -> str:
    return f"{day_prefix(day)}/{MANIFEST_NAME}"


def day_sources(day: date) -> list[str]:
    return sorted(set(archived_events(day).values_list("source", flat=True).distinct()))


def calls_per_day(sources: int) -> int:
    """S3 calls to archive one day: per source the upload and its read-back, then the
    manifest's upload and read-back (an upload past 8 MB goes in 8 MB parts, one call each:
    the read timeout bounds each part's silence, not its transfer at a given bandwidth)."""
    return 2 * sources + 2


def day_worst_case_seconds(sources: list[str] | int) -> float:
    count = sources if isinstance(sources, int) else len(sources)
    return calls_per_day(count) * ArchiveClientConfig.from_settings().call_worst_case_seconds()


# --- one line per event ---------------------------------------------------------------------

_FIELDS = [f for f in RawEvent._meta.concrete_fields if f.attname != "restored_at"]


def _encode_row(event: RawEvent) -> dict:
    line: dict = {}
    for f in _FIELDS:
        value = getattr(event, f.attname)
        if isinstance(f, models.BinaryField):
            line[f"{f.attname}_base64"] = base64.b64encode(bytes(value)).decode("ascii")
        elif isinstance(value, datetime):
            line[f.attname] = value.isoformat()
        else:
            line[f.attname] = value
    return line


def _decode_row(line: dict) -> RawEvent:
    values: dict[str, Any] = {}
    for f in _FIELDS:
        if f.attname not in line and f"{f.attname}_base64" not in line:
            continue  # a column newer than the archive: the model's default
        if isinstance(f, models.BinaryField):
            values[f.attname] = base64.b64decode(line[f"{f.attname}_base64"], validate=True)
        elif isinstance(f, models.DateTimeField) and line.get(f.attname) is not None:
            values[f.attname] = datetime.fromisoformat(line[f.attname])
        else:
            values[f.attname] = line.get(f.attname)
    return RawEvent(**values)


# --- archive --------------------------------------------------------------------------------


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time_of_day.min, tzinfo=UTC)


def archived_events(day: date) -> QuerySet[RawEvent]:
    """The events of `day` an archive holds: all but those restored from one already."""
    return RawEvent.objects.filter(
        received_at__gte=_day_start(day), received_at__lt=_day_start(day + timedelta(days=1))
    ).exclude(origin=RawEventOrigin.RESTORED)


@dataclass
class ArchivedFile:
    source: str
    name: str
    events: int
    size: int
    sha256: str
    first_id: int
    last_id: int


@dataclass
class DayArchive:
    day: date
    files: list[ArchivedFile] = field(default_factory=list)

    @property
    def events(self) -> int:
        return sum(f.events for f in self.files)


def _gzipped_lines(events: Iterable[RawEvent]) -> tuple[SpooledTemporaryFile, ArchivedFile]:
    spool = SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115 (returned, closed by caller)
    count, first_id, last_id = 0, 0, 0
    # mtime=0: the same rows give the same bytes, so a re-run's checksum is the same too.
    with gzip.GzipFile(fileobj=spool, mode="wb", mtime=0) as gz:
        for event in events:
            gz.write(json.dumps(_encode_row(event), separators=(",", ":")).encode() + b"\n")
            count += 1
            first_id = first_id or event.id
            last_id = event.id
    spool.seek(0)
    digest = hashlib.sha256()
    size = 0
    while chunk := spool.read(1024 * 1024):
        digest.update(chunk)
        size += len(chunk)
    spool.seek(0)
    info = ArchivedFile("", "", count, size, digest.hexdigest(), first_id, last_id)
    return spool, info


def _verify_object(storage: Storage, name: str, *, size: int, sha256: str) -> None:
    """Read `name` back from the store and compare it with what was written."""
    digest = hashlib.sha256()
    read = 0
    with storage.open(name, "rb") as stored:
        while chunk := stored.read(1024 * 1024):
            digest.update(chunk)
            read += len(chunk)
    if read != size or digest.hexdigest() != sha256:
        raise ArchiveFailed(
            f"archive object {name} reads back as {read} bytes, sha256 {digest.hexdigest()}; "
            f"wrote {size} bytes, sha256 {sha256}"
        )


def archive_day(day: date, *, partition: str, storage: Storage | None = None) -> DayArchive:
    """Write and verify the archive of `day` (module doc); ArchiveFailed if anything fails."""
    storage = storage or archive_storage()
    events = archived_events(day)
    result = DayArchive(day=day)
    sources = day_sources(day)
    if not sources:
        # Nothing of its own (empty, or only rows restored from this very archive): writing
        # a manifest now would overwrite the day's real one with an empty list.
        return result
    try:
        for source in sources:
            rows = events.filter(source=source).order_by("id").iterator(chunk_size=_READ_CHUNK)
            spool, info = _gzipped_lines(rows)
            info.source, info.name = source, archive_file_name(day, source)
            with spool:
                storage.save(info.name, File(spool, name=info.name))
            _verify_object(storage, info.name, size=info.size, sha256=info.sha256)
            result.files.append(info)
        manifest = json.dumps(
            {
                "format": ARCHIVE_FORMAT,
                "day": day.isoformat(),
                "partition": partition,
                "archived_at": timezone.now().isoformat(),
                "events": result.events,
                "body_encryption_keys": sorted(
                    set(events.values_list("body_encryption", flat=True).distinct()) - {""}
                ),
                "files": [
                    {
                        "source": f.source,
                        "name": f.name,
                        "events": f.events,
                        "bytes": f.size,
                        "sha256": f.sha256,
                        "first_id": f.first_id,
                        "last_id": f.last_id,
                    }
                    for f in result.files
                ],
            },
            indent=1,
        ).encode()
        storage.save(manifest_name(day), File(io.BytesIO(manifest), name=MANIFEST_NAME))
        _verify_object(
            storage,
            manifest_name(day),
            size=len(manifest),
            sha256=hashlib.sha256(manifest).hexdigest(),
        )
    except _transient_errors() as exc:
        raise ArchiveFailed(f"archive of {day} failed: {type(exc).__name__}: {exc}") from exc
    logger.info(
        "ingress.archive.written",
        extra={"day": day.isoformat(), "files": len(result.files), "events": result.events},
    )
    return result


# --- restore --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestoreFilter:
    source: str | None = None
    event_type: str | None = None
    received_from: datetime | None = None  # inclusive
    received_until: datetime | None = None  # exclusive

    def matches(self, event: RawEvent) -> bool:
        return (
            (self.event_type is None or event.event_type == self.event_type)
            and (self.received_from is None or event.received_at >= self.received_from)
            and (self.received_until is None or event.received_at < self.received_until)
        )


@dataclass
class RestoreResult:
    day: date
    dry_run: bool = False
    restored: int = 0
    already_present: int = 0
    filtered_out: int = 0

    def lines(self) -> list[str]:
        would = "would " if self.dry_run else ""
        return [
            f"{self.day}: {would}restore {self.restored} events",
            f"{self.day}: skipped {self.already_present} still in the store",
            f"{self.day}: {self.filtered_out} outside the filter",
        ]


def read_manifest(day: date, storage: Storage | None = None) -> dict:
    storage = storage or archive_storage()
    try:
        with storage.open(manifest_name(day), "rb") as stored:
            return json.loads(stored.read())
    except FileNotFoundError as exc:
        raise ArchiveFailed(f"no archive of {day}: {manifest_name(day)} does not exist") from exc
    except _transient_errors() as exc:
        raise ArchiveFailed(f"manifest of {day} unreadable: {type(exc).__name__}") from exc


def _archived_rows(storage: Storage, entry: dict) -> Iterator[RawEvent]:
    spool = SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115
    with spool:
        digest = hashlib.sha256()
        try:
            with storage.open(entry["name"], "rb") as stored:
                while chunk := stored.read(1024 * 1024):
                    digest.update(chunk)
                    spool.write(chunk)
        except _transient_errors() as exc:
            raise ArchiveFailed(f"{entry['name']} unreadable: {type(exc).__name__}") from exc
        if digest.hexdigest() != entry["sha256"]:
            raise ArchiveFailed(f"{entry['name']} does not match its manifest's sha256")
        spool.seek(0)
        with gzip.GzipFile(fileobj=spool, mode="rb") as gz:
            for line in gz:
                yield _decode_row(json.loads(line))


def _insert_missing(batch: list[RawEvent], result: RestoreResult) -> None:
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [RESTORE_LOCK_KEY])
        ids = [event.id for event in batch]
        # Bounded by the batch's own time span, so PostgreSQL reads only its partitions.
        present = set(
            RawEvent.objects.filter(
                id__in=ids,
                received_at__gte=min(e.received_at for e in batch),
                received_at__lte=max(e.received_at for e in batch),
            ).values_list("id", flat=True)
        )
        missing = [event for event in batch if event.id not in present]
        result.already_present += len(present)
        for event in missing:
            event.origin = RawEventOrigin.RESTORED
            event.restored_at = now
        if not result.dry_run:
            RawEvent.objects.bulk_create(missing, batch_size=RESTORE_BATCH_SIZE)
        result.restored += len(missing)


def restore_archived_events(
    day: date,
    *,
    only: RestoreFilter | None = None,
    dry_run: bool = False,
    storage: Storage | None = None,
) -> RestoreResult:
    """Put `day`'s archived events (those `only` matches) back in the store (module doc)."""
    storage = storage or archive_storage()
    only = only or RestoreFilter()
    manifest = read_manifest(day, storage)
    result = RestoreResult(day=day, dry_run=dry_run)
    for entry in manifest["files"]:
        if only.source is not None and entry["source"] != only.source:
            result.filtered_out += entry["events"]
            continue
        batch: list[RawEvent] = []
        for event in _archived_rows(storage, entry):
            if not only.matches(event):
                result.filtered_out += 1
                continue
            batch.append(event)
            if len(batch) >= RESTORE_BATCH_SIZE:
                _insert_missing(batch, result)
                batch = []
        if batch:
            _insert_missing(batch, result)
    logger.info(
        "ingress.archive.restored",
        extra={
            "day": day.isoformat(),
            "dry_run": dry_run,
            "restored": result.restored,
            "already_present": result.already_present,
        },
    )
    return result
