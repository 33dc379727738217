"""The operations figures and their colours: what /ops/ shows and /metrics exports.

Every figure is read when asked for, by aggregate queries in the database, each bounded by
a window on an indexed column or served by a partial index. `received_at` is indexed and
the raw event table's daily partition key: a window on it, closed at both ends (the
partitions created ahead are empty but would still be scanned), prunes the scan to the one
or two partitions it overlaps. Queue depths come from `ingress.selectors` and
`outbox.selectors` (partial indexes on the pending and due rows). Nothing is cached, so the
page and a scrape cost the same handful of queries (about eight).

Colours come from one table, SLOS: red where the service level is missed (the SLOs are
listed with their reasons in docs/console.md, "Ops page"), yellow from YELLOW_FRACTION of
that line, so on-call sees a figure approach the line before it is crossed.

The charts (the last 24 h per hour) are one GROUP BY date_trunc('hour') per figure over the
same kind of closed window, so they prune as the figures do.
"""

import itertools
import logging
import math
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import (
    Case,
    Count,
    ExpressionWrapper,
    F,
    FloatField,
    Func,
    Q,
    Sum,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Trunc
from django.utils import timezone
from prometheus_client.multiprocess import MultiProcessCollector

from console.jobs.services import ReplaySlo, bulk_jobs_active_counts, replay_slo
from console.models import ACK_ROLLUP_BUCKETS, AckLatencyHour, VolumeBucket, VolumeKind
from console.ops.ack_rollup import ack_rollup_collect
from console.pauses.services import PauseRow, pauses_active
from console.presentation import EMPTY, format_seconds
from console.selectors import inbox_queue_depths
from ingress.deliveries.pace import HandlerLimits, handler_limits
from ingress.handlers import all_handlers
from ingress.models import (
    Delivery,
    DeliveryStatus,
    DispatchStatus,
    RawEvent,
    ReconciliationRun,
    SignatureStatus,
)
from ingress.receive import ACK_SECONDS
from ingress.reconcile.selectors import reconciliation_runs_latest
from ingress.selectors import LaneBacklog, handler_backlogs, handler_paces, source_backlogs
from ingress.sources import all_sources
from outbox.breaker import RENDER_SERVICE_BREAKER
from outbox.models import BreakerState, CircuitBreaker, RecapSideEffect, SideEffectStatus
from outbox.selectors import circuit_breaker_get, side_effect_depths

logger = logging.getLogger(__name__)

VIEW_OPS_PERMISSION = "console.view_ops"

HOUR = timedelta(hours=1)
DAY = timedelta(hours=24)
# Lags are "now": events received in the last hour. An event older than that still waiting
# shows in the oldest-pending and oldest-due ages instead.
LAG_WINDOW = HOUR
LAG_PERCENTILE = 0.95
ACK_PERCENTILE = 0.99


# --- Levels and the SLO table -----------------------------------------------------------------


class Level(StrEnum):
    GREEN = "green"
    YELLOW = "yellow"
    RED = "red"
    NO_DATA = "no-data"


# Yellow from this fraction of the red line, for every figure in SLOS.
YELLOW_FRACTION = 0.5


@dataclass(frozen=True)
class Slo:
    """One coloured figure: red from `red_at` (the SLO is missed), yellow from half of it."""

    key: str
    label: str
    red_line: float
    unit: str  # "seconds", "rows" or "ratio"
    basis: str  # where the red line comes from
    # A red line that already has a setting elsewhere is read from it, so the page and the
    # code that owns the setting never disagree.
    red_setting: str = ""

    @property
    def red_at(self) -> float:
        return getattr(settings, self.red_setting) if self.red_setting else self.red_line

    @property
    def yellow_at(self) -> float:
        return self.red_at * YELLOW_FRACTION

    def level(self, value: float | None) -> Level:
        if value is None:
            return Level.NO_DATA
        if value >= self.red_at:
            return Level.RED
        if value >= self.yellow_at:
            return Level.YELLOW
        return Level.GREEN

    def display(self, value: float | None) -> str:
        if value is None:
            return "no data"
        if self.unit == "seconds":
            return format_seconds(value)
        if self.unit == "ratio":
            return f"{value * 100:.4f} %"
        return str(math.ceil(value))

    @property
    def display_yellow(self) -> str:
        # Counts are whole: with a red line of 1 row there is no yellow band.
        if self.unit == "rows" and math.ceil(self.yellow_at) >= self.red_at:
            return EMPTY
        return self.display(self.yellow_at)

    @property
    def display_red(self) -> str:
        return self.display(self.red_at)


SLOS: dict[str, Slo] = {
    slo.key: slo
    for slo in (
        Slo("ack_p99", "ACK latency p99", 0.250, "seconds", "SLO: ACK p99 < 250 ms"),
        Slo(
            "verification_lag_p95",
            "Verification lag p95 (received → verdict, last hour)",
            60,
            "seconds",
            "SLO: verification lag p95 < 60 s",
        ),
        Slo(
            "processing_lag_p95",
            "Processing lag p95 (verdict → handled, last hour)",
            300,
            "seconds",
            "SLO: processing lag p95 < 5 min",
        ),
        Slo(
            "raw_events_oldest_pending_age",
            "Oldest event waiting for verification",
            60,
            "seconds",
            "verification SLO: an event waiting longer has already missed it",
        ),
        Slo(
            "raw_events_oldest_questioned_age",
            "Oldest event waiting on a repeated-signature question",
            1800,
            "seconds",
            "GitHub's delivery log answers within the 10 min listing lag and a 5 min run; "
            "an event waiting longer waits for an operator",
        ),
        Slo(
            "deliveries_oldest_due_age",
            "Oldest due delivery",
            300,
            "seconds",
            "processing SLO: a delivery due longer has already missed it",
        ),
        Slo(
            "side_effects_oldest_due_age",
            "Oldest due side effect",
            600,
            "seconds",
            "no SLO of its own: five missed runs of the two-minute dispatcher",
        ),
        Slo("dead_deliveries", "Dead deliveries", 1, "rows", "SLO: dead rows = 0"),
        Slo("dead_side_effects", "Dead side effects", 1, "rows", "SLO: dead rows = 0"),
        # Of the raw events selected for a bulk replay (and deliveries re-armed by one), the
        # share not handled within 2 min of the operator's click: jobs measured in 24 h.
        Slo(
            "replay_missed",
            "Selected events not replayed within 2 min (bulk jobs, last 24 h)",
            0.01,
            "ratio",
            "SLO: 99 % of selected raw events replayed within 2 min (click → handler done)",
        ),
        Slo(
            "drift",
            "Reconciliation drift (worst latest run)",
            0.0001,
            "ratio",
            "SLO: drift < 0.01 % (RECONCILE_DRIFT_SLO)",
            red_setting="RECONCILE_DRIFT_SLO",
        ),
    )
}

# By the state's value (a row's state is read back as a plain string).
BREAKER_LEVELS: dict[str, Level] = {
    BreakerState.CLOSED: Level.GREEN,
    BreakerState.HALF_OPEN: Level.YELLOW,
    BreakerState.OPEN: Level.RED,
}


# --- Reads --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceVolume:
    source: str
    last_hour: int
    last_24h: int
    pending_24h: int
    verified_24h: int
    rejected_24h: int
    questioned_24h: int = 0


@dataclass(frozen=True)
class RejectionCount:
    source: str
    reason: str
    last_hour: int
    last_24h: int


def raw_event_volume(*, now: datetime) -> list[dict]:
    """Events received in the last 24 h per (clock hour, source, status, reason), and of
    those in the last hour: the verdicts from the counts the database keeps as rows change
    (console.models.VolumeBucket, by 5 minutes received), the pending ones from their index.
    One query; it serves the volume table, the rejections, /metrics and the volume chart."""
    day, hour = bucket_floor(now - DAY), bucket_floor(now - HOUR)
    counted = (
        VolumeBucket.objects.filter(kind=VolumeKind.EVENTS, bucket__gte=day, bucket__lte=now)
        .annotate(hour=_hour("bucket"), signature_status=F("status"), rejection_reason=F("reason"))
        .values("hour", "source", "signature_status", "rejection_reason")
        .annotate(
            last_hour=Coalesce(Sum("rows", filter=Q(bucket__gte=hour)), 0), last_24h=Sum("rows")
        )
        .order_by()
    )
    pending = (
        RawEvent.objects.filter(
            signature_status=SignatureStatus.PENDING, received_at__gte=day, received_at__lte=now
        )
        .annotate(hour=_hour("received_at"))
        .values("hour", "source", "signature_status", "rejection_reason")
        .annotate(last_hour=Count("id", filter=Q(received_at__gte=hour)), last_24h=Count("id"))
        .order_by()
    )
    return [row for row in counted.union(pending, all=True) if row["last_24h"]]


def bucket_floor(moment: datetime) -> datetime:
    """The start of the 5-minute bucket `moment` falls in (as the database's date_bin)."""
    return moment - timedelta(
        minutes=moment.minute % 5, seconds=moment.second, microseconds=moment.microsecond
    )


def _volume_by_source(rows: list[dict]) -> list[SourceVolume]:
    totals: dict[str, dict[str, int]] = {name: defaultdict(int) for name in all_sources()}
    for row in rows:
        counts = totals.setdefault(row["source"], defaultdict(int))
        counts["last_hour"] += row["last_hour"]
        counts["last_24h"] += row["last_24h"]
        counts[row["signature_status"]] += row["last_24h"]
    return [
        SourceVolume(
            source=source,
            last_hour=counts["last_hour"],
            last_24h=counts["last_24h"],
            pending_24h=counts[SignatureStatus.PENDING],
            verified_24h=counts[SignatureStatus.VERIFIED],
            rejected_24h=counts[SignatureStatus.REJECTED],
            questioned_24h=counts[SignatureStatus.QUESTIONED],
        )
        for source, counts in sorted(totals.items())
    ]


def _rejections(rows: list[dict]) -> list[RejectionCount]:
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        if row["signature_status"] == SignatureStatus.REJECTED:
            pair = counts[(row["source"], row["rejection_reason"])]
            pair[0] += row["last_hour"]
            pair[1] += row["last_24h"]
    rejected = [
        RejectionCount(source=source, reason=reason, last_hour=last_hour, last_24h=last_24h)
        for (source, reason), (last_hour, last_24h) in counts.items()
    ]
    return sorted(rejected, key=lambda r: (-r.last_24h, r.source, r.reason))


class EpochSeconds(Func):
    """An interval in seconds."""

    template = "EXTRACT(EPOCH FROM %(expressions)s)"
    output_field = FloatField()


@dataclass(frozen=True)
class Lags:
    verification_p95: float | None
    processing_p95: float | None
    verification_events: int
    processing_events: int


# The lags are percentiles over at most this many of the newest events of their window: exact
# up to that many an hour, a sample of the newest beyond, and a bounded read at any volume.
LAG_SAMPLE = 2000
CHART_LAG_SAMPLE = 500


def _verification_lag(now: datetime) -> EpochSeconds:
    return EpochSeconds(Coalesce(F("verified_at"), Value(now)) - F("received_at"))


def _processing_lag(now: datetime) -> ExpressionWrapper:
    dispatched = Q(dispatch_status=DispatchStatus.DISPATCHED, verified_at__isnull=False)
    processing = EpochSeconds(Coalesce(F("handled_at"), Value(now)) - F("verified_at"))
    return ExpressionWrapper(
        Case(When(dispatched, then=processing), default=None), output_field=FloatField()
    )


def raw_event_lags(*, now: datetime) -> Lags:
    """p95 of received → verdict and verdict → handled for the newest LAG_SAMPLE events
    received in LAG_WINDOW.

    An event still waiting counts with the time it has waited so far (the lag it will have
    at least), so a stalled worker turns the figure red at once instead of hiding its backlog
    behind the few events that did get through. Processing lag counts dispatched events only:
    rejected, duplicate and unhandled events have nothing to process.
    """
    newest = (
        RawEvent.objects.filter(received_at__gte=now - LAG_WINDOW, received_at__lte=now)
        .order_by("-received_at")
        .annotate(verification=_verification_lag(now), processing=_processing_lag(now))
        .values("verification", "processing")[:LAG_SAMPLE]
    )
    with connection.cursor() as cursor:
        sql, params = newest.query.sql_with_params()
        cursor.execute(
            "SELECT percentile_cont(%s) WITHIN GROUP (ORDER BY verification), "  # noqa: S608
            "percentile_cont(%s) WITHIN GROUP (ORDER BY processing), count(*), "
            f"count(processing) FROM ({sql}) AS newest",
            (LAG_PERCENTILE, LAG_PERCENTILE, *params),
        )
        row = dict(
            zip(
                ("verification_p95", "processing_p95", "verification_events", "processing_events"),
                cursor.fetchone(),
                strict=True,
            )
        )
    return Lags(**row)


# --- How long until we catch up ---------------------------------------------------------------

# The drain rate is measured over this window: short enough to follow a recovery, long
# enough not to swing with one batch.
DRAIN_WINDOW = timedelta(minutes=5)


@dataclass(frozen=True)
class QueueDrain:
    """A queue's backlog, how many items left it in DRAIN_WINDOW, and the time to clear the
    backlog at that rate (None: nothing drained while something waits — not catching up)."""

    queue: str
    label: str
    backlog: int
    drained: int
    window_seconds: float

    @property
    def per_second(self) -> float:
        return self.drained / self.window_seconds

    @property
    def seconds_to_clear(self) -> float | None:
        if not self.backlog:
            return 0.0
        return self.backlog / self.per_second if self.drained else None

    @property
    def display_to_clear(self) -> str:
        seconds = self.seconds_to_clear
        return "not draining" if seconds is None else format_seconds(seconds)


def drained_counts(*, now: datetime) -> dict[tuple[str, str], int]:
    """What left the inbox's queues in DRAIN_WINDOW, by (kind, name): verdicts by source,
    finished deliveries by handler, counted by the minute as they happen
    (console.models.VolumeBucket); the window is the minutes that began in the last
    DRAIN_WINDOW (a minute more at most). One read for the queues and their lanes."""
    since = now - DRAIN_WINDOW
    counted: dict[tuple[str, str], int] = defaultdict(int)
    for kind, name, rows in (
        VolumeBucket.objects.filter(
            kind__in=[VolumeKind.VERDICTS, VolumeKind.FINISHED],
            bucket__gte=since.replace(second=0, microsecond=0),
            bucket__lte=now,
        )
        .values("kind", "source")
        .annotate(rows=Sum("rows"))
        .values_list("kind", "source", "rows")
    ):
        counted[(kind, name)] += rows
    return counted


def queue_drains(
    *, now: datetime, inbox: dict, outbox: dict, counted: dict[tuple[str, str], int] | None = None
) -> list[QueueDrain]:
    """Backlog, drain and time to clear of the three queues: verdicts and finished deliveries
    from drained_counts (`counted`, when the caller read them already), side effects finished
    in the window from their finished_at index."""
    since = now - DRAIN_WINDOW
    if counted is None:
        counted = drained_counts(now=now)
    total: dict[str, int] = defaultdict(int)
    for (kind, _), rows in counted.items():
        total[kind] += rows
    side_effects = RecapSideEffect.objects.filter(
        finished_at__gte=since, finished_at__lte=now
    ).count()
    deliveries = inbox["deliveries"]
    window = DRAIN_WINDOW.total_seconds()
    return [
        QueueDrain(
            "raw_events",
            "Raw events to verify",
            inbox["raw_events_pending"],
            total[VolumeKind.VERDICTS],
            window,
        ),
        QueueDrain(
            "deliveries",
            "Deliveries to run (pending and processing; held ones wait for a resume)",
            deliveries[DeliveryStatus.PENDING] + deliveries[DeliveryStatus.PROCESSING],
            total[VolumeKind.FINISHED],
            window,
        ),
        QueueDrain(
            "side_effects",
            "Side effects to dispatch (pending and processing)",
            outbox[SideEffectStatus.PENDING] + outbox[SideEffectStatus.PROCESSING],
            side_effects,
            window,
        ),
    ]


@dataclass(frozen=True)
class LaneDrain(QueueDrain):
    """One source's share of the raw events to verify, or one handler's of the deliveries to
    run: its backlog, what is in flight, its pace over DRAIN_WINDOW and its time to clear,
    and for a handler its limits now (a downstream's slow-down included)."""

    in_flight: int = 0
    held: int = 0
    rate_limit: float | None = None  # per second now; None: no rate
    concurrency: int | None = None
    paused_until: datetime | None = None  # a downstream asked for a pause
    slowed_until: datetime | None = None  # its rate is reduced until then

    @property
    def over_replay_slo(self) -> bool:
        """Its backlog takes longer to clear than the replay SLO allows (or does not drain)."""
        seconds = self.seconds_to_clear
        return bool(self.backlog) and (
            seconds is None or seconds > settings.BULK_JOB_REPLAY_SLO_SECONDS
        )


def lane_drains(
    *, now: datetime, counted: dict[tuple[str, str], int] | None = None
) -> list[LaneDrain]:
    """Per source and per handler: backlog, in flight, pace and time to clear (issue 41).
    Backlogs from the partial indexes of unfinished rows, paces from drained_counts, limits
    from where handlers are declared and the pace rows; never a read of the store."""
    if counted is None:
        counted = drained_counts(now=now)
    window = DRAIN_WINDOW.total_seconds()
    sources = source_backlogs()
    lanes = [
        LaneDrain(
            "source",
            name,
            backlog=backlog.waiting + backlog.in_flight,
            drained=counted[(VolumeKind.VERDICTS, name)],
            window_seconds=window,
            in_flight=backlog.in_flight,
        )
        for name in sorted(
            set(all_sources())
            | set(sources)
            | {name for kind, name in counted if kind == VolumeKind.VERDICTS}
        )
        for backlog in [sources.get(name, LaneBacklog(0, 0))]
    ]
    handlers = handler_backlogs()
    paces = handler_paces()
    specs = {spec.name: spec for spec in all_handlers()}
    for name in sorted(
        set(specs) | set(handlers) | {n for kind, n in counted if kind == VolumeKind.FINISHED and n}
    ):
        backlog = handlers.get(name, LaneBacklog(0, 0))
        limits = handler_limits(specs[name]) if name in specs else HandlerLimits()
        pace = paces.get(name)
        slowed = pace is not None and pace.slowed_until is not None and now < pace.slowed_until
        rate = limits.rate
        if rate is not None and slowed and pace is not None:
            rate *= pace.factor
        lanes.append(
            LaneDrain(
                "handler",
                name,
                backlog=backlog.waiting + backlog.in_flight,
                drained=counted[(VolumeKind.FINISHED, name)],
                window_seconds=window,
                in_flight=backlog.in_flight,
                held=backlog.held,
                rate_limit=rate,
                concurrency=limits.concurrency,
                paused_until=pace.not_before
                if pace is not None and pace.not_before and now < pace.not_before
                else None,
                slowed_until=pace.slowed_until if slowed and pace is not None else None,
            )
        )
    return lanes


# --- ACK latency (in-process histogram, not the database) -------------------------------------


@dataclass(frozen=True)
class AckLatency:
    p99: float | None
    count: int


def ack_latency_collectors() -> list:
    """Where the receive view's ACK histogram lives: this process's memory, or, in
    prometheus_client's multiprocess mode, every worker process's file in
    PROMETHEUS_MULTIPROC_DIR (merged when collected)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return [MultiProcessCollector(None)]
    return [ACK_SECONDS]


def histogram_quantile(fraction: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile over (upper bound, cumulative count) pairs, ascending.

    Linear interpolation inside the bucket holding the rank; a rank in the +Inf bucket
    answers the highest finite bound, as Prometheus does.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = fraction * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for upper_bound, count in buckets:
        if count >= rank:
            if math.isinf(upper_bound):
                return lower_bound
            share = (rank - lower_count) / (count - lower_count)
            return lower_bound + (upper_bound - lower_bound) * share
        lower_bound, lower_count = upper_bound, count
    return lower_bound


def ack_latency(*, collectors: list | None = None) -> AckLatency:
    """ACK p99 over every source, since the process started (or, in multiprocess mode,
    since PROMETHEUS_MULTIPROC_DIR was last emptied). Prometheus has the windowed view."""
    (family_described,) = ACK_SECONDS.describe()
    name = family_described.name
    cumulative: dict[float, float] = defaultdict(float)
    for collector in collectors if collectors is not None else ack_latency_collectors():
        for family in collector.collect():
            if family.name != name:
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    cumulative[float(sample.labels["le"])] += sample.value
    buckets = sorted(cumulative.items())
    return AckLatency(
        p99=histogram_quantile(ACK_PERCENTILE, buckets),
        count=int(buckets[-1][1]) if buckets else 0,
    )


# --- The snapshot -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    slo: Slo
    value: float | None

    @property
    def level(self) -> Level:
        return self.slo.level(self.value)

    @property
    def display(self) -> str:
        return self.slo.display(self.value)


@dataclass(frozen=True)
class OpsSnapshot:
    taken_at: datetime
    sources: list[SourceVolume]
    rejections: list[RejectionCount]
    inbox: dict  # ingress.selectors.inbox_depths()
    outbox: dict  # outbox.selectors.side_effect_depths()
    lags: Lags
    ack: AckLatency
    breaker: CircuitBreaker | None
    # The newest finished run of every (provider, source, scope).
    reconciliation: list[ReconciliationRun]
    # The volume chart, from the same grouped scan as `sources` (the ops page draws it).
    volume_by_hour: "HourlySeries | None" = None
    # Bulk jobs: the replay SLO over the jobs measured in the last 24 h, and active jobs.
    replay: ReplaySlo | None = None
    bulk_jobs: dict | None = None
    # Handler pauses in force, oldest first, each coloured by its age.
    pauses: tuple[PauseRow, ...] = ()
    deliveries_held: int = 0  # by any pause (a delivery two pauses cover counts once)
    drains: tuple[QueueDrain, ...] = ()
    # Per source and per handler (fair shares and limits).
    lanes: tuple[LaneDrain, ...] = ()

    @property
    def breaker_state(self) -> str:
        # No row yet: the breaker has never tripped.
        return self.breaker.state if self.breaker is not None else BreakerState.CLOSED

    @property
    def breaker_level(self) -> Level:
        return BREAKER_LEVELS[self.breaker_state]

    @property
    def side_effects_waiting(self) -> dict[str, int]:
        """Pending render rows by why they wait: the breaker (the service failed as a whole;
        not charged) versus their own errors (charged), and our configuration."""
        return self.outbox["waiting"]

    def values(self) -> dict[str, float | None]:
        """The value of every figure in SLOS. A queue with nothing waiting has age 0."""
        return {
            "ack_p99": self.ack.p99,
            "verification_lag_p95": self.lags.verification_p95,
            "processing_lag_p95": self.lags.processing_p95,
            "raw_events_oldest_pending_age": self.inbox["raw_events_oldest_pending_age_seconds"]
            or 0.0,
            "raw_events_oldest_questioned_age": self.inbox[
                "raw_events_oldest_questioned_age_seconds"
            ]
            or 0.0,
            "deliveries_oldest_due_age": self.inbox["deliveries_oldest_due_age_seconds"] or 0.0,
            "side_effects_oldest_due_age": self.outbox["oldest_due_age_seconds"] or 0.0,
            "dead_deliveries": self.inbox["deliveries"]["dead"],
            "dead_side_effects": self.outbox["dead"],
            "replay_missed": self.replay.missed_ratio if self.replay else None,
            "drift": self.worst_drift,
        }

    @property
    def worst_drift(self) -> float | None:
        # A failed run measured nothing: it neither raises nor lowers the figure.
        drifts = [run.drift for run in self.reconciliation if run.drift is not None]
        return max(drifts) if drifts else None

    def figures(self) -> list[Figure]:
        values = self.values()
        return [Figure(slo=slo, value=values[key]) for key, slo in SLOS.items()]

    def worst_level(self) -> Level:
        levels = {figure.level for figure in self.figures()} | {self.breaker_level}
        levels |= {Level(row.level) for row in self.pauses}
        for level in (Level.RED, Level.YELLOW, Level.GREEN):
            if level in levels:
                return level
        return Level.NO_DATA


def ack_rollup_now(*, now: datetime) -> None:
    """Roll this host's ACK histogram up for the 24 h chart (console/ops/ack_rollup.py): done by
    every read of the figures, so no process runs a thread for it. Our database failing
    costs the chart an interval, never the page."""
    try:
        ack_rollup_collect(*ack_latency_collectors(), now=now)
    except DatabaseError as error:
        logger.warning("console.ack_rollup.failed", extra={"error_class": type(error).__name__})


def ops_snapshot(*, now: datetime | None = None) -> OpsSnapshot:
    now = now or timezone.now()
    ack_rollup_now(now=now)
    volume = raw_event_volume(now=now)
    inbox = inbox_queue_depths(now=now)
    outbox = side_effect_depths(now=now)
    counted = drained_counts(now=now)
    return OpsSnapshot(
        taken_at=now,
        sources=_volume_by_source(volume),
        rejections=_rejections(volume),
        volume_by_hour=_hourly_volume(volume, now=now),
        inbox=inbox,
        outbox=outbox,
        lags=raw_event_lags(now=now),
        ack=ack_latency(),
        breaker=circuit_breaker_get(name=RENDER_SERVICE_BREAKER),
        reconciliation=list(reconciliation_runs_latest()),
        replay=replay_slo(now=now, window=DAY),
        bulk_jobs=bulk_jobs_active_counts(),
        pauses=tuple(pauses_active()),
        deliveries_held=inbox["deliveries"][DeliveryStatus.HELD],
        drains=tuple(queue_drains(now=now, inbox=inbox, outbox=outbox, counted=counted)),
        lanes=tuple(lane_drains(now=now, counted=counted)),
    )


# --- The last 24 h, per hour (the ops page's charts) -------------------------------------------

CHART_HOURS = 24


def chart_hours(*, now: datetime) -> list[datetime]:
    """The 24 hour buckets the charts show, oldest first; the last one is the current hour."""
    current = now.replace(minute=0, second=0, microsecond=0)
    return [current - HOUR * n for n in range(CHART_HOURS - 1, -1, -1)]


def _hour_window(now: datetime) -> tuple[datetime, datetime]:
    # Closed at both ends, as every window in this module: the scan prunes to the partitions
    # of the day before and of today (see the module docstring).
    return chart_hours(now=now)[0], now


def _hour(field: str):
    return Trunc(field, "hour", tzinfo=UTC)


@dataclass(frozen=True)
class HourlySeries:
    hours: list[datetime]
    # name -> one value per hour (None: no data in that hour)
    series: dict[str, list[float | None]]


def _by_hour(hours: list[datetime], rows: Iterable[tuple[datetime, str, float | None]]):
    index = {hour: n for n, hour in enumerate(hours)}
    series: dict[str, list[float | None]] = defaultdict(lambda: [None] * len(hours))
    for hour, name, value in rows:
        if hour in index:
            series[name][index[hour]] = value
    return series


def hourly_volume(*, now: datetime) -> HourlySeries:
    """Events received per hour per source, and how many of them were rejected."""
    return _hourly_volume(raw_event_volume(now=now), now=now)


def _hourly_volume(rows: list[dict], *, now: datetime) -> HourlySeries:
    # raw_event_volume's window starts before the first bucket: those rows are left out.
    hours = chart_hours(now=now)
    per_source: dict[tuple[datetime, str], float] = defaultdict(float)
    rejected: dict[datetime, float] = defaultdict(float)
    for row in rows:
        per_source[(row["hour"], row["source"])] += row["last_24h"]
        if row["signature_status"] == SignatureStatus.REJECTED:
            rejected[row["hour"]] += row["last_24h"]
    series = _by_hour(hours, ((hour, source, n) for (hour, source), n in per_source.items()))
    for name in all_sources():
        series.setdefault(name, [None] * len(hours))
    filled = {name: [value or 0 for value in values] for name, values in sorted(series.items())}
    filled["rejected (all sources)"] = [rejected.get(hour, 0) for hour in hours]
    return HourlySeries(hours=hours, series=filled)


def hourly_lags(*, now: datetime) -> HourlySeries:
    """p95 verification and processing lag of the events received in each hour, counted as
    raw_event_lags() counts them (a waiting event with the time it has waited so far), over
    the newest CHART_LAG_SAMPLE events of each hour: one query, 24 bounded index reads."""
    hours = chart_hours(now=now)
    newest = (
        RawEvent.objects.filter(
            received_at__gte=RawSQL("hours.start", ()),
            received_at__lt=RawSQL("hours.start + interval '1 hour'", ()),
            received_at__lte=now,
        )
        .order_by("-received_at")
        .annotate(verification=_verification_lag(now), processing=_processing_lag(now))
        .values("verification", "processing")[:CHART_LAG_SAMPLE]
    )
    sql, params = newest.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT hours.start, percentile_cont(%s) WITHIN GROUP (ORDER BY verification), "  # noqa: S608
            "percentile_cont(%s) WITHIN GROUP (ORDER BY processing) "
            "FROM unnest(%s::timestamptz[]) AS hours(start), "
            f"LATERAL ({sql}) AS newest GROUP BY hours.start",
            (LAG_PERCENTILE, LAG_PERCENTILE, hours, *params),
        )
        rows = cursor.fetchall()
    pairs = []
    for hour, verification, processing in rows:
        pairs.append((hour, "verification lag p95", verification))
        pairs.append((hour, "processing lag p95", processing))
    series = _by_hour(hours, pairs)
    return HourlySeries(
        hours=hours,
        series={
            name: series.get(name, [None] * len(hours))
            for name in ("verification lag p95", "processing lag p95")
        },
    )


def hourly_dead(*, now: datetime) -> HourlySeries:
    """Deliveries and side effects that went dead in each hour (by when they gave up): one
    GROUP BY each, on the dead deliveries' partial index and the side effect table (one row
    per recap)."""
    hours = chart_hours(now=now)
    start, end = _hour_window(now)
    pairs: list[tuple[datetime, str, float | None]] = []
    for name, model, status in (
        ("dead deliveries", Delivery, DeliveryStatus.DEAD),
        ("dead side effects", RecapSideEffect, SideEffectStatus.DEAD),
    ):
        rows = (
            model.objects.filter(status=status, finished_at__gte=start, finished_at__lte=end)
            .annotate(hour=_hour("finished_at"))
            .values("hour")
            .annotate(rows=Count("id"))
            .order_by()
        )
        pairs.extend((row["hour"], name, row["rows"]) for row in rows)
    series = _by_hour(hours, pairs)
    return HourlySeries(
        hours=hours,
        series={
            name: [value or 0 for value in series.get(name, [None] * len(hours))]
            for name in ("dead deliveries", "dead side effects")
        },
    )


def hourly_ack_p99(*, now: datetime) -> HourlySeries:
    """ACK p99 per hour per source, from the ACK histogram's roll-up (console/ops/ack_rollup.py):
    the buckets of each (source, hour) row through histogram_quantile, as the running ACK
    p99 figure and Prometheus compute it. One indexed read of at most 24 rows per source."""
    hours = chart_hours(now=now)
    start, end = _hour_window(now)
    bounds = [bound for bound, _ in ACK_ROLLUP_BUCKETS]
    pairs = []
    for row in AckLatencyHour.objects.filter(hour__gte=start, hour__lte=end):
        cumulative = list(itertools.accumulate(row.bucket_counts()))
        pairs.append(
            (
                row.hour,
                row.source,
                histogram_quantile(ACK_PERCENTILE, list(zip(bounds, cumulative, strict=True))),
            )
        )
    series = _by_hour(hours, pairs)
    for name in all_sources():
        series.setdefault(name, [None] * len(hours))
    return HourlySeries(hours=hours, series=dict(sorted(series.items())))
