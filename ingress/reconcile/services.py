"""Every write a reconciliation run makes: its run record, and the events it backfills.

Transactions are short and never span a provider call: the run row is started, updated
after each page and finished in transactions of their own, and each page's backfill is
one transaction. A run killed mid-way therefore leaves its progress behind, and the next
start marks it failed once it is older than any run may last.
"""

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ingress.encryption import encrypt_request
from ingress.models import RawEvent, RawEventOrigin, ReconciliationRun, ReconciliationStatus
from ingress.reconcile.errors import RUN_BUSY, ReconcileBusy
from ingress.reconcile.window import Window, iso
from ingress.sources import Source

logger = logging.getLogger(__name__)

# The run record keeps this many of the missing events' provider ids (the logs keep counts).
MISSING_IDS_KEPT = 200
ABANDONED = "Abandoned: still `running` long after its budget; the process running it died."


def drift_ratio(*, missing: int, compared: int) -> float:
    """missing / compared; 0 when the provider listed nothing (nothing can have been lost)."""
    return missing / compared if compared else 0.0


@dataclass
class Tally:
    """What a run has compared and repaired so far."""

    pages: int = 0
    provider_count: int = 0
    known_count: int = 0
    pending_count: int = 0
    missing_count: int = 0
    backfilled_count: int = 0
    redelivered_count: int = 0
    missing_ids: list[str] = field(default_factory=list)

    def add(self, *, known: int, pending: int, missing: Sequence[str]) -> None:
        self.provider_count += known + pending + len(missing)
        self.known_count += known
        self.pending_count += pending
        self.missing_count += len(missing)
        room = MISSING_IDS_KEPT - len(self.missing_ids)
        self.missing_ids += list(missing[: max(room, 0)])

    @property
    def drift(self) -> float:
        return drift_ratio(missing=self.missing_count, compared=self.provider_count)

    def counters(self) -> dict[str, object]:
        return {
            "pages": self.pages,
            "provider_count": self.provider_count,
            "known_count": self.known_count,
            "pending_count": self.pending_count,
            "missing_count": self.missing_count,
            "backfilled_count": self.backfilled_count,
            "redelivered_count": self.redelivered_count,
            "missing_ids": self.missing_ids,
        }


@transaction.atomic
def reconciliation_run_start(
    *, provider: str, source: str, scope: str, window: Window, now: datetime | None = None
) -> ReconciliationRun:
    """A `running` record, or ReconcileBusy while another run of the same thing is running.

    The partial unique index `reconciliationrun_one_running` decides, so two hosts starting
    the nightly run at once cannot both proceed. A run still `running` after twice the run
    budget cannot be alive (RunClock stops every run inside its budget): it is marked failed
    first, so a crash never blocks reconciliation for good.
    """
    now = now or timezone.now()
    same = ReconciliationRun.objects.filter(
        provider=provider, source=source, scope=scope, status=ReconciliationStatus.RUNNING
    )
    stale_before = now - timedelta(seconds=2 * settings.RECONCILE_RUN_BUDGET_SECONDS)
    stale = list(same.filter(started_at__lt=stale_before).values_list("id", flat=True))
    if stale:
        ReconciliationRun.objects.filter(id__in=stale).update(
            status=ReconciliationStatus.FAILED, finished_at=now, error=ABANDONED
        )
        logger.warning("ingress.reconcile.abandoned", extra={"run_ids": stale})
    try:
        with transaction.atomic():
            run = ReconciliationRun.objects.create(
                provider=provider,
                source=source,
                scope=scope,
                window_start=window.since,
                window_end=window.until,
                started_at=now,
                notes="\n".join(window.notes),
            )
    except IntegrityError as exc:
        other = same.order_by("started_at").first()
        what = f"{source} {scope}".strip()
        if other is None:  # it finished between the INSERT and this SELECT
            raise ReconcileBusy(RUN_BUSY.format(id="?", what=what, started="just now")) from exc
        raise ReconcileBusy(
            RUN_BUSY.format(id=other.id, what=what, started=iso(other.started_at))
        ) from exc
    logger.info(
        "ingress.reconcile.started",
        extra={"run_id": run.id, "provider": provider, "source": source, "scope": scope},
    )
    return run


@transaction.atomic
def reconciliation_run_progress(*, run: ReconciliationRun, tally: Tally) -> None:
    ReconciliationRun.objects.filter(pk=run.pk, status=ReconciliationStatus.RUNNING).update(
        **tally.counters()
    )


@transaction.atomic
def reconciliation_run_finish(
    *,
    run: ReconciliationRun,
    tally: Tally,
    status: ReconciliationStatus,
    error: str = "",
    notes: Iterable[str] = (),
    now: datetime | None = None,
) -> ReconciliationRun:
    run = ReconciliationRun.objects.select_for_update().get(pk=run.pk)
    for name, value in tally.counters().items():
        setattr(run, name, value)
    run.status = status
    run.finished_at = now or timezone.now()
    run.drift = None if status == ReconciliationStatus.FAILED else tally.drift
    run.error = error[:4000]
    run.notes = "\n".join(notes)[:4000]
    run.save()
    logger.info(
        "ingress.reconcile.finished",
        extra={
            "run_id": run.id,
            "provider": run.provider,
            "source": run.source,
            "status": str(run.status),
            "provider_count": run.provider_count,
            "missing": run.missing_count,
            "backfilled": run.backfilled_count,
            "redelivered": run.redelivered_count,
            "drift": run.drift,
        },
    )
    return run


@dataclass(frozen=True)
class FetchedEvent:
    """An event fetched from a provider's API, as it will be stored."""

    provider_event_id: str
    body: bytes
    # Where it was fetched from (the object's canonical API path) and the response headers
    # worth keeping (the provider's request id, for a support ticket).
    path: str
    headers: dict[str, str]


@transaction.atomic
def raw_events_backfill(
    *, source: Source, events: Sequence[FetchedEvent], now: datetime | None = None
) -> list[RawEvent]:
    """Store fetched events as `backfilled` raw events, pending like any received one.

    They then take the normal path — verification (by fetch, see verdict.py), dedup on the
    provider's event id, deliveries, handlers — so a webhook for the same event that turns
    up later is a duplicate of the backfilled row, and the other way round.
    """
    now = now or timezone.now()
    # Encrypted at rest like a received body (RAW_EVENT_ENCRYPTION_KEYS); hashed in plaintext.
    stored = [encrypt_request(event.body, event.headers) for event in events]
    rows = RawEvent.objects.bulk_create(
        RawEvent(
            source=source.name,
            provider=source.provider,
            method="GET",
            path=event.path,
            headers=headers,
            body=body,
            body_encryption=body_encryption,
            body_sha256=hashlib.sha256(event.body).hexdigest(),
            remote_addr=None,
            received_at=now,
            origin=RawEventOrigin.BACKFILLED,
        )
        for event, (body, headers, body_encryption) in zip(events, stored, strict=True)
    )
    logger.info(
        "ingress.reconcile.backfilled",
        extra={"source": source.name, "count": len(rows), "raw_event_ids": [r.id for r in rows]},
    )
    return rows
