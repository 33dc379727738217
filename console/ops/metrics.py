"""Prometheus exposition for /metrics: the ops page's figures, read at scrape time.

OpsCollector runs the same queries as /ops/ (console/ops/figures.py) on every scrape, so Prometheus
sees what on-call sees; nothing is kept in a process between scrapes. Next to it the
receive view's ACK histogram, from this process or, with PROMETHEUS_MULTIPROC_DIR, merged
from every worker process's file.

Label values come only from closed sets: configured source names (anything else in the
store is counted as "other"), provider names, the status choices, the rejection reasons,
the breaker's states. No payload, header, id or secret ever becomes a label.
"""

from collections import Counter
from collections.abc import Iterable, Iterator

from django.conf import settings
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from console.incidents.services import IncidentGroup, incident_groups
from console.models import IncidentKind
from console.ops.figures import LaneDrain, OpsSnapshot, ack_latency_collectors, ops_snapshot
from ingress.handlers import all_handlers
from ingress.models import RejectionReason, SignatureStatus
from ingress.providers import PROVIDERS
from ingress.selectors import rejected_payloads_dropped
from ingress.sources import all_sources
from kernel.routers import ReplicaStatus, replica_status
from outbox.breaker import RENDER_SERVICE_BREAKER
from outbox.models import BreakerState
from outbox.selectors import QUEUE_STATUSES
from regions.selectors import ReplicationLag, replication_lags

OTHER = "other"


def _gauge(name: str, documentation: str, value: float | None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    if value is not None:  # absent rather than a made-up 0 (e.g. a p95 of no events)
        family.add_metric([], value)
    return family


def _labelled(name: str, documentation: str, labels: list[str], values: dict) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for label_values, value in sorted(values.items()):
        family.add_metric(list(label_values), value)
    return family


class OpsCollector(Collector):
    """No describe(): registering it must not run its queries."""

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        # Measured first, as on the ops page: the figures may be read from the replica
        # only while it is fit to serve them.
        replica = replica_status(fresh=True)
        yield from ops_families(ops_snapshot())
        yield incident_family(incident_groups())
        yield from replica_families(replica)
        yield rejected_payloads_family(rejected_payloads_dropped())
        yield from region_families(replication_lags(timezone.now()))


def rejected_payloads_family(dropped: dict[str, int]) -> CounterMetricFamily:
    """Rejected requests whose payload the inbox dropped past their source's cap
    (ingress/rejected_payloads.py), every configured source with its zero. Counted over the
    minutes still accounted for (RAW_EVENT_REJECTED_RETENTION_DAYS): a minute expiring
    reads as a counter reset."""
    sources = sorted(all_sources())
    totals = Counter(dict.fromkeys(sources, 0))
    for source, count in dropped.items():
        totals[source if source in sources else OTHER] += count
    family = CounterMetricFamily(
        "eventdrop_rejected_payloads_dropped",
        "Rejected requests whose body and headers were dropped past their source's "
        "INBOX_REJECTED_PAYLOAD_BYTES_PER_MINUTE (the row is kept).",
        labels=["source"],
    )
    for source, count in sorted(totals.items()):
        family.add_metric([source], count)
    return family


def region_families(lags: list[ReplicationLag]) -> Iterator[GaugeMetricFamily]:
    """Logical replication between regions (docs/multi-region.md), per direction as this
    region sees it: the stream from each peer. With one region the families have no sample."""
    lag = GaugeMetricFamily(
        "eventdrop_region_replication_lag_seconds",
        "Age of the peer region's last heartbeat as replicated into this region: an upper "
        "bound of the replication lag from it (its inbox beats about once a second).",
        labels=["source", "target"],
    )
    up = GaugeMetricFamily(
        "eventdrop_region_subscription_up",
        "1 while this region's subscription from the peer has a running apply worker.",
        labels=["source", "target"],
    )
    for one in lags:
        if one.seconds is not None:
            lag.add_metric([one.source, one.target], one.seconds)
        up.add_metric([one.source, one.target], int(one.connected))
    yield lag
    yield up


def replica_families(replica: ReplicaStatus) -> Iterator[GaugeMetricFamily]:
    """The read replica as this process measured it for the scrape (kernel/routers.py). Without a
    replica configured the families are declared with no sample: an alert on them stays
    silent, and a dashboard shows "no data" rather than a made-up 0."""
    configured = replica.configured
    yield _gauge(
        "eventdrop_replica_up",
        "1 when the read replica answers and is in recovery (a replica of the primary).",
        (1 if replica.reachable and replica.lag_seconds is not None else 0) if configured else None,
    )
    yield _gauge(
        "eventdrop_replica_lag_seconds",
        "How far the read replica's replay is behind the primary (absent: not measurable).",
        replica.lag_seconds,
    )
    yield _gauge(
        "eventdrop_replica_max_lag_seconds",
        "DATABASE_REPLICA_MAX_LAG_SECONDS: the lag past which the read-only screens are "
        "served by the primary.",
        replica.max_lag_seconds if configured else None,
    )
    yield _gauge(
        "eventdrop_replica_serving_reads",
        "1 while the read-only screens are served by the replica, 0 while the primary "
        "serves them instead (the replica too far behind, unreachable or promoted).",
        int(replica.serving_reads) if configured else None,
    )


def ops_families(snapshot: OpsSnapshot) -> Iterator[GaugeMetricFamily]:
    sources = sorted(all_sources())

    def source_label(name: str) -> str:
        return name if name in sources else OTHER

    # Every source, (source, status) and (source, reason), zeros included: a series that
    # vanishes when nothing happened is "no data" to an alert rule, not 0.
    hour = Counter(dict.fromkeys(((s,) for s in sources), 0))
    day = Counter(dict.fromkeys(((s, st) for s in sources for st in SignatureStatus.values), 0))
    rejected = Counter(dict.fromkeys(((s, r) for s in sources for r in RejectionReason.values), 0))
    for volume in snapshot.sources:
        source = source_label(volume.source)
        hour[(source,)] += volume.last_hour
        day[(source, SignatureStatus.PENDING.value)] += volume.pending_24h
        day[(source, SignatureStatus.VERIFIED.value)] += volume.verified_24h
        day[(source, SignatureStatus.REJECTED.value)] += volume.rejected_24h
        day[(source, SignatureStatus.QUESTIONED.value)] += volume.questioned_24h
    for rejection in snapshot.rejections:
        reason = rejection.reason if rejection.reason in RejectionReason.values else OTHER
        rejected[(source_label(rejection.source), reason)] += rejection.last_24h

    yield _labelled(
        "eventdrop_raw_events_received_last_hour",
        "Webhooks stored in the last hour, per source.",
        ["source"],
        hour,
    )
    yield _labelled(
        "eventdrop_raw_events_received_last_24h",
        "Webhooks stored in the last 24 h, per source and current signature status.",
        ["source", "signature_status"],
        day,
    )
    yield _labelled(
        "eventdrop_raw_events_rejected_last_24h",
        "Webhooks received in the last 24 h and rejected, per source and reason.",
        ["source", "reason"],
        rejected,
    )

    inbox, outbox = snapshot.inbox, snapshot.outbox
    yield _gauge(
        "eventdrop_raw_events_pending",
        "Raw events waiting for verification.",
        inbox["raw_events_pending"],
    )
    yield _gauge(
        "eventdrop_raw_events_oldest_pending_age_seconds",
        "Age of the oldest raw event waiting for verification (0: none waiting).",
        inbox["raw_events_oldest_pending_age_seconds"] or 0.0,
    )
    yield _gauge(
        "eventdrop_raw_events_questioned",
        "Raw events whose body-only signature was seen before under another delivery id, "
        "waiting for the provider's delivery log or an operator to answer (neither handled "
        "nor rejected).",
        inbox["raw_events_questioned"],
    )
    yield _gauge(
        "eventdrop_raw_events_oldest_questioned_age_seconds",
        "Age of the oldest questioned raw event (0: none waiting).",
        inbox["raw_events_oldest_questioned_age_seconds"] or 0.0,
    )
    yield _labelled(
        "eventdrop_deliveries",
        "Handler deliveries waiting, running or dead (dead: gave up, needs a human).",
        ["status"],
        {(status,): count for status, count in inbox["deliveries"].items()},
    )
    yield _gauge(
        "eventdrop_deliveries_oldest_due_age_seconds",
        "How long the oldest due delivery has waited (0: none due).",
        inbox["deliveries_oldest_due_age_seconds"] or 0.0,
    )
    yield _labelled(
        "eventdrop_side_effects",
        "Recap side effects (render requests) per status (dead: gave up, needs a human).",
        ["status"],
        {(status,): outbox[status] for status in QUEUE_STATUSES},
    )
    yield _gauge("eventdrop_side_effects_due", "Side effects due now.", outbox["due"])
    yield _gauge(
        "eventdrop_side_effects_stale_processing",
        "Side effects processing longer than OUTBOX_STALE_PROCESSING_SECONDS (worker died).",
        outbox["stale_processing"],
    )
    yield _labelled(
        "eventdrop_side_effects_waiting",
        "Pending side effects by why they wait: breaker (the render service or its deploy "
        "answered about itself, or its breaker is open), ambiguous (an answer neither a "
        "render nor a verdict), database (ours failed), configuration (ours was incomplete) "
        "- none charged - and own_error (their own last attempt failed, charged).",
        ["wait_reason"],
        {(reason,): count for reason, count in outbox["waiting"].items()},
    )
    yield _gauge(
        "eventdrop_side_effects_oldest_due_age_seconds",
        "How long the oldest due side effect has waited (0: none due).",
        outbox["oldest_due_age_seconds"] or 0.0,
    )
    yield _gauge(
        "eventdrop_side_effects_oldest_waiting_age_seconds",
        "How long the longest uncharged wait of a pending side effect has lasted: answers "
        "about the render service or its deploy, ambiguous ones, our database (0: none).",
        outbox["oldest_waiting_age_seconds"] or 0.0,
    )
    yield _gauge(
        "eventdrop_verification_lag_p95_seconds",
        "p95 of received -> verdict for events received in the last hour (waiting ones "
        "count with their age so far).",
        snapshot.lags.verification_p95,
    )
    yield _gauge(
        "eventdrop_processing_lag_p95_seconds",
        "p95 of verdict -> handled for dispatched events received in the last hour "
        "(unfinished ones count with their age so far).",
        snapshot.lags.processing_p95,
    )
    # Per provider and source, the worst scope: a scope ("repo acme/app hook 7") is free
    # text, not a closed set, so it is never a label.
    drift: dict[tuple[str, str], float] = {}
    finished: dict[tuple[str, str], float] = {}
    for run in snapshot.reconciliation:
        key = (run.provider if run.provider in PROVIDERS else OTHER, source_label(run.source))
        if run.drift is not None:
            drift[key] = max(drift.get(key, 0.0), run.drift)
        if run.finished_at is not None:
            finished[key] = max(finished.get(key, 0.0), run.finished_at.timestamp())
    yield _labelled(
        "eventdrop_reconciliation_drift_ratio",
        "Missing / listed in the newest finished reconciliation run (worst scope).",
        ["provider", "source"],
        drift,
    )
    yield _labelled(
        "eventdrop_reconciliation_last_finished_timestamp_seconds",
        "When the newest reconciliation run finished (alert when it gets old).",
        ["provider", "source"],
        finished,
    )
    replay = snapshot.replay
    yield _gauge(
        "eventdrop_replay_slo_events_last_24h",
        "Raw events (and re-armed deliveries) of bulk jobs whose replay SLO was measured in "
        "the last 24 h, counted from the operator's click.",
        replay.events if replay else 0,
    )
    yield _gauge(
        "eventdrop_replay_slo_within_last_24h",
        "Of those, handled within BULK_JOB_REPLAY_SLO_SECONDS (2 min) of the click.",
        replay.within if replay else 0,
    )
    yield _gauge(
        "eventdrop_replay_slo_missed_ratio",
        "Share of them not handled within 2 min (SLO: below 0.01; absent: no job measured).",
        replay.missed_ratio if replay else None,
    )
    yield _labelled(
        "eventdrop_bulk_jobs_active",
        "Bulk replay/re-arm jobs queued, running or cancelling.",
        ["state"],
        {(state,): count for state, count in (snapshot.bulk_jobs or {}).items()},
    )
    yield _gauge(
        "eventdrop_handlers_paused",
        "Handler pauses in force (a handler, or every handler of a source).",
        len(snapshot.pauses),
    )
    yield _gauge(
        "eventdrop_handler_pause_oldest_age_seconds",
        "Age of the oldest handler pause in force (0: none).",
        max((row.pause.age_seconds for row in snapshot.pauses), default=0.0),
    )
    yield _gauge(
        "eventdrop_deliveries_held",
        "Deliveries held by handler pauses (not run, no attempt charged).",
        snapshot.deliveries_held,
    )
    drains = {(drain.queue,): drain for drain in snapshot.drains}
    yield _labelled(
        "eventdrop_queue_backlog",
        "Items waiting in each queue (raw events to verify, deliveries to run, side effects "
        "to dispatch).",
        ["queue"],
        {key: drain.backlog for key, drain in drains.items()},
    )
    yield _labelled(
        "eventdrop_queue_drain_per_second",
        "Items each queue finished per second over the last 5 minutes.",
        ["queue"],
        {key: drain.per_second for key, drain in drains.items()},
    )
    yield _labelled(
        "eventdrop_queue_seconds_to_clear",
        "Time to clear each queue's backlog at its drain rate (absent: not draining while "
        "items wait).",
        ["queue"],
        {
            key: drain.seconds_to_clear
            for key, drain in drains.items()
            if drain.seconds_to_clear is not None
        },
    )
    yield from lane_families(snapshot.lanes, sources=set(sources))
    yield _labelled(
        "eventdrop_circuit_breaker_state",
        "1 for the breaker's current state, 0 for the others.",
        ["breaker", "state"],
        {
            (RENDER_SERVICE_BREAKER, state): int(state == snapshot.breaker_state)
            for state in BreakerState.values
        },
    )


def lane_families(lanes: Iterable[LaneDrain], *, sources: set[str]) -> Iterator[GaugeMetricFamily]:
    """Per source and per handler (issue 41): backlog, in flight, pace, time to clear and the
    limits now. A source or handler no longer configured is "other"."""
    handlers = {spec.name for spec in all_handlers()}
    by_lane: dict[str, dict[str, list[LaneDrain]]] = {"source": {}, "handler": {}}
    for lane in lanes:
        known = sources if lane.queue == "source" else handlers
        name = lane.label if lane.label in known else OTHER
        by_lane[lane.queue].setdefault(name, []).append(lane)
    for queue, what in (("source", "raw events to verify"), ("handler", "deliveries to run")):
        groups = by_lane[queue]
        key = {name: (name,) for name in groups}
        # The figures that add up when several lanes fall into "other".
        for metric, attribute, help_text in (
            ("backlog", "backlog", f"{what}, in flight included."),
            ("in_flight", "in_flight", f"{what} a worker holds now."),
            (
                "drain_per_second",
                "per_second",
                f"{what} finished per second over the last 5 minutes.",
            ),
        ):
            yield _labelled(
                f"eventdrop_{queue}_{metric}",
                f"Per {queue}: {help_text}",
                [queue],
                {
                    key[n]: sum(getattr(lane, attribute) for lane in group)
                    for n, group in groups.items()
                },
            )
        yield _labelled(
            f"eventdrop_{queue}_seconds_to_clear",
            f"Per {queue}: time to clear its backlog at its pace (absent: not draining while "
            "items wait); EventDropBacklogPastReplaySlo fires past the replay SLO.",
            [queue],
            {
                key[n]: group[0].seconds_to_clear
                for n, group in groups.items()
                if len(group) == 1 and group[0].seconds_to_clear is not None
            },
        )
        yield _labelled(
            f"eventdrop_{queue}_not_draining",
            f"Per {queue}: 1 while items wait and none finished in the last 5 minutes.",
            [queue],
            {
                key[n]: int(any(lane.backlog and not lane.drained for lane in group))
                for n, group in groups.items()
            },
        )
    handler_lanes = {n: group[0] for n, group in by_lane["handler"].items() if n != OTHER}
    yield _labelled(
        "eventdrop_handler_rate_limit_per_second",
        "A handler's rate now: declared (or HANDLER_LIMITS), halved while a downstream's "
        "slow-down lasts (absent: no rate).",
        ["handler"],
        {(n,): lane.rate_limit for n, lane in handler_lanes.items() if lane.rate_limit},
    )
    yield _labelled(
        "eventdrop_handler_concurrency_limit",
        "A handler's deliveries in flight at most (absent: no limit).",
        ["handler"],
        {(n,): lane.concurrency for n, lane in handler_lanes.items() if lane.concurrency},
    )
    yield _labelled(
        "eventdrop_handler_downstream_paused",
        "1 while a handler's downstream asked for a pause (429, Retry-After): nothing of it is "
        "claimed.",
        ["handler"],
        {(n,): int(lane.paused_until is not None) for n, lane in handler_lanes.items()},
    )
    yield _gauge(
        "eventdrop_replay_slo_seconds",
        "BULK_JOB_REPLAY_SLO_SECONDS: a backlog that takes longer to clear misses it.",
        float(settings.BULK_JOB_REPLAY_SLO_SECONDS),
    )


def incident_family(groups: list[IncidentGroup]) -> GaugeMetricFamily:
    """Rows of each failure group by its state: the alert EventDropIncidentOpen names the
    group and links to its page from these labels. Scope and error class are handler, effect
    type and source names, exception class names and rejection reasons: names from our code
    and configuration, never from a payload."""
    # A source or handler no longer configured is "other", as elsewhere on /metrics;
    # effect types are a closed set of choices.
    known = {
        IncidentKind.REJECTED_EVENTS: set(all_sources()),
        IncidentKind.DEAD_DELIVERIES: {spec.name for spec in all_handlers()},
        IncidentKind.STUCK_DELIVERIES: {spec.name for spec in all_handlers()},
    }
    rows: Counter = Counter()
    for g in groups:
        names = known.get(IncidentKind(g.kind))
        scope = g.scope if names is None or g.scope in names else OTHER
        error_class = g.error_class
        if g.kind == IncidentKind.REJECTED_EVENTS and error_class not in RejectionReason.values:
            error_class = OTHER
        rows[(g.kind, scope, error_class, g.state)] += g.rows
    return _labelled(
        "eventdrop_incident_rows",
        "Rows of each failure group (console/incidents/services.py) by its state: open, "
        "acknowledged or resolved.",
        ["kind", "scope", "error_class", "state"],
        rows,
    )


def metrics_registry() -> CollectorRegistry:
    """A registry per scrape: the database figures plus the ACK histogram's collector(s)."""
    registry = CollectorRegistry()
    registry.register(OpsCollector())
    for collector in ack_latency_collectors():
        registry.register(collector)
    return registry
