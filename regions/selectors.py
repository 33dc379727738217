"""Reads about regions: the effective processing decision, whether this region may process
or write processing state, and the replication lag per direction (docs/multi-region.md)."""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from kernel.processing_region import (
    NO_PROCESSING_DECISION,
    PROCESSING_NOT_STARTED,
    STANDBY_REGION,
    ProcessingNotStarted,
    StandbyRegion,
)
from regions.configuration import multi_region, region_name
from regions.models import ProcessingDecision, RegionState


def effective_decision() -> ProcessingDecision | None:
    """The decision with the highest epoch this region can see (ties: the deciding region's
    name), or None before any."""
    return ProcessingDecision.objects.order_by("-epoch", "-decided_in").first()


@dataclass(frozen=True)
class ProcessingVerdict:
    may_process: bool
    why: str
    epoch: int = 0


def processing_verdict(
    *,
    me: RegionState,
    others: list[RegionState],
    decision: ProcessingDecision | None,
    now: datetime,
) -> ProcessingVerdict:
    """The rule, written once (docs/multi-region.md, "Processing in exactly one place"): the
    decision names this region, and every other region acknowledges it freshly, or this
    region's lease under this epoch runs, or the decision was a takeover here, under a lease
    ago."""
    if decision is None:
        return ProcessingVerdict(False, "no processing decision yet")
    if decision.processing_region != me.name:
        return ProcessingVerdict(
            False, f"epoch {decision.epoch} names {decision.processing_region}", decision.epoch
        )
    fresh = timedelta(seconds=settings.EVENTDROP_REGION_PEER_FRESH_SECONDS)
    lease = timedelta(seconds=settings.EVENTDROP_REGION_LEASE_SECONDS)
    if others and all(
        other.seen_epoch >= decision.epoch
        and other.heartbeat_at is not None
        and other.heartbeat_at >= now - fresh
        for other in others
    ):
        return ProcessingVerdict(True, "acknowledged by every other region", decision.epoch)
    if me.lease_epoch == decision.epoch and me.lease_until and me.lease_until > now:
        return ProcessingVerdict(True, "lease running", decision.epoch)
    if decision.peer_lost and decision.decided_in == me.name and decision.decided_at > now - lease:
        return ProcessingVerdict(True, "takeover, others declared lost", decision.epoch)
    return ProcessingVerdict(
        False, f"epoch {decision.epoch} not yet acknowledged by the other regions", decision.epoch
    )


def processing_writes_guard() -> None:
    """kernel.processing_region.require_processing_region with several regions: StandbyRegion
    (409) while the decision names another region, ProcessingNotStarted (503) while it names
    this one but no pass has taken the lease under it yet (docs/multi-region.md, "Writes
    outside processing")."""
    if not multi_region():
        return
    me = region_name()
    decision = effective_decision()
    retry_after = settings.INGRESS_UNAVAILABLE_RETRY_AFTER
    if decision is None:
        raise ProcessingNotStarted(
            NO_PROCESSING_DECISION.format(region=me),
            region=me,
            processing_region="",
            epoch=0,
            retry_after=retry_after,
        )
    if decision.processing_region != me:
        raise StandbyRegion(
            STANDBY_REGION.format(
                region=me, processing_region=decision.processing_region, epoch=decision.epoch
            ),
            region=me,
            processing_region=decision.processing_region,
            epoch=decision.epoch,
        )
    lease_epoch = RegionState.objects.filter(name=me).values_list("lease_epoch", flat=True).first()
    if lease_epoch != decision.epoch:
        raise ProcessingNotStarted(
            PROCESSING_NOT_STARTED.format(region=me, epoch=decision.epoch),
            region=me,
            processing_region=me,
            epoch=decision.epoch,
            retry_after=retry_after,
        )


@dataclass(frozen=True)
class ReplicationLag:
    """The stream from `source` into `target` (this region), as seen here."""

    source: str
    target: str
    # now - the source's heartbeat as replicated here: an upper bound of the lag while the
    # source's inbox beats (about once a second), None before its first beat arrived.
    seconds: float | None
    connected: bool
    received_lsn: str | None


def replication_lags(now: datetime) -> list[ReplicationLag]:
    if not multi_region():
        return []
    me = region_name()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT subname, pid IS NOT NULL, received_lsn::text FROM pg_stat_subscription "
            "WHERE relid IS NULL AND subname LIKE %s",
            [f"eventdrop_{me}_from_%"],
        )
        streams = {
            name.removeprefix(f"eventdrop_{me}_from_"): (connected, lsn)
            for name, connected, lsn in cursor.fetchall()
        }
    beats = {row.name: row.heartbeat_at for row in RegionState.objects.exclude(name=me)}
    lags = []
    for source in sorted(set(streams) | set(beats)):
        connected, lsn = streams.get(source, (False, None))
        beat = beats.get(source)
        seconds = max(0.0, (now - beat).total_seconds()) if beat else None
        lags.append(ReplicationLag(source, me, seconds, connected, lsn))
    return lags


# The lag at which the ops page turns a direction yellow and red: the alert
# (deploy/prometheus, EventDropRegionReplicationLagging) pages at a minute.
LAG_YELLOW_SECONDS = 10.0
LAG_RED_SECONDS = 60.0


@dataclass(frozen=True)
class LagLine:
    source: str
    target: str
    seconds: float | None
    connected: bool

    @property
    def level(self) -> str:
        if self.seconds is None or not self.connected or self.seconds >= LAG_RED_SECONDS:
            return "red"
        return "yellow" if self.seconds >= LAG_YELLOW_SECONDS else "green"

    @property
    def display(self) -> str:
        return f"{self.seconds:.1f} s" if self.seconds is not None else "—"


def region_overview(now: datetime) -> dict | None:
    """What the ops page shows about regions; None with one region."""
    if not multi_region():
        return None
    decision = effective_decision()
    return {
        "region": region_name(),
        "processing_region": decision.processing_region if decision else "",
        "epoch": decision.epoch if decision else 0,
        "lags": [
            LagLine(lag.source, lag.target, lag.seconds, lag.connected)
            for lag in replication_lags(now)
        ],
    }
