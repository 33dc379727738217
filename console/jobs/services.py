"""Bulk replay and re-arm as background jobs: preview, start, batches, cancel, the replay SLO.

An operator describes a selection (a filter, or explicit ids) and gets a *preview*: a
BulkJob row in `previewed` with the count and the breakdown by source / type / status, and
the selection bounded to the rows that existed then (`upper_id`). Nothing has been touched.
Starting it writes the audit row (one console.OperatorAction, `running`, naming who clicked)
and enqueues `console.tasks.bulk_job_run` on django-q2; the web request ends there.

The task walks the selection in id order, BULK_JOB_BATCH_SIZE rows per transaction:

- The batch locks the job row first. So two runs of the same job (a continuation and a
  sweep's re-enqueue, say) take turns, and each sees the cursor the other committed.
- It reads the next ids above `cursor`, acts on them through the domain services (the same
  ones the console's one-request actions use), records the acted-on rows (BulkJobItem, for
  the SLO) and moves `cursor`, counts and heartbeat — all in that one transaction. A worker
  killed mid-batch loses the batch's work with its connection; the next run does it again.
  Nothing is done twice, and replaying or re-arming a row is idempotent anyway (one
  delivery per event and handler, a unique constraint).
- Between batches it looks at the job's state: `cancelling` (the operator's cancel) ends
  the job `cancelled` after the batch in flight.
- Our database failing is transient: the task raises, the job stays `running`, and the
  minute sweep enqueues it again once its heartbeat is BULK_JOB_STALE_SECONDS old. Only a
  bug outside the per-row services ends a job `failed`; a row's own refusal or error is
  counted on the row and the job goes on.

A task runs at most BULK_JOB_TASK_BUDGET_SECONDS and then enqueues its continuation, so no
task approaches Q_TIMEOUT however large the job. The row locks a batch holds are those of
its own rows (the inbox claims with SKIP LOCKED and passes them by) and only until its
commit: 100,000 rows never hold a request, a table or the inbox for more than one batch.

The replay SLO ("99 % of selected raw events replayed within 2 minutes") is measured per
job from the click (`started_at`) to the handler's checkpoint: the first `done` attempt of
each delivery after the click (the delivery history is never rewritten, so a later replay
cannot move it). It is measured once the SLO window has passed (bulk_jobs_measure_slo, in
the minute sweep) and kept on the job; console/ops/figures.py and /metrics show it.
"""

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import models, transaction
from django.db.models import Count, Max, Min, Q, QuerySet, Sum
from django.utils import timezone

from console.deliveries.selectors import ERROR_CLASS as _ERROR_CLASS
from console.deliveries.selectors import NOT_AN_ERROR_CLASS, DeliveryFilter
from console.models import (
    BULK_JOB_ACTIVE_STATES,
    BULK_JOB_FINAL_STATES,
    BulkJob,
    BulkJobItem,
    BulkJobKind,
    BulkJobState,
    ItemOutcome,
    OperatorAction,
    OperatorActionKind,
    OperatorActionOutcome,
    VolumeBucket,
)
from console.ops.ack_rollup import ack_rollup_prune
from console.presentation import EMPTY
from console.raw_events.selectors import RawEventFilter
from console.side_effects.selectors import SideEffectFilter
from ingress.deliveries.pace import handler_limits
from ingress.handlers import all_handlers, get_handler, handlers_for
from ingress.models import (
    Delivery,
    DeliveryAttempt,
    DeliveryStatus,
    DispatchStatus,
    RawEvent,
    SignatureStatus,
)
from ingress.services import deliveries_rearm_batch, raw_events_replay_batch
from ingress.sources import all_sources
from kernel.errors import EventDropError
from kernel.processing_region import ProcessingWritesRefused, require_processing_region
from kernel.queue import DATABASE_UNAVAILABLE
from outbox.models import RecapSideEffect, SideEffectStatus
from outbox.services import side_effect_rearm

logger = logging.getLogger(__name__)

TASK = "console.tasks.bulk_job_run"
TASK_GROUP = "console.bulk_job"
# An explicit selection travels in one request and is stored on the job row.
MAX_SELECTED_IDS = 100_000
# Refusals and errors kept on the job (and its operator action) for the detail page.
MAX_PROBLEMS = 50
# Breakdown rows per dimension on the preview (event types can be many).
BREAKDOWN_TOP = 20
SLO_PERCENTILE = 0.99
# Items are read back in chunks when the SLO is measured: a bounded IN list per query.
SLO_CHUNK = 2000
# The figures' counts by 5 minutes (console.models.VolumeBucket) are read for 24 h at most.
VOLUME_RETENTION = timedelta(hours=48)
# Acted-on rows are kept this long after the job's SLO was measured, then pruned.
ITEM_RETENTION = timedelta(days=7)

# The `status` filter is the row's own status: which values that is, per kind.
STATUSES_PER_KIND = {
    BulkJobKind.REPLAY_RAW_EVENTS: SignatureStatus.values,
    BulkJobKind.REARM_DELIVERIES: DeliveryStatus.values,
    BulkJobKind.REARM_SIDE_EFFECTS: SideEffectStatus.values,
}
READ_PERMISSION = "console.view_operatoraction"  # a job is an operator action
WRITE_PERMISSION = "console.operate"

NOTHING_SELECTED = "The selection is empty: nothing to preview."
TOO_MANY_IDS = "{count} ids given; at most {limit} can be selected by id (use a filter)."
NOT_A_FILTER = "{name} does not apply to {kind}."
UNKNOWN_IDS = "Unknown ids: {ids}."
UNKNOWN_HANDLER = (
    "No handler is registered as “{name}” and no delivery names it (registered: {names})."
)
WINDOW_ORDER = "received_before must be later than received_after."
NOT_PREVIEWED = "Job #{id} is {state}: only a previewed job can be started."
EMPTY_JOB = "Job #{id} selected no rows: there is nothing to start."
ALREADY_FINISHED = "Job #{id} is already {state}."
CANCEL_REQUESTED = "cancel requested by {username} at {at}"
UNEXPECTED_ROW_ERROR = "Unexpected {error}; see the logs for bulk job #{job_id}."
JOB_FAILED = "{error} while running batch {batch}; see the logs for bulk job #{job_id}."
DELIVERY_NOT_DEAD = "Delivery #{id} is not dead: only dead deliveries are re-armed."

# The kinds whose rows have a handler to run: the replay SLO is measured for these.
SLO_KINDS = (BulkJobKind.REPLAY_RAW_EVENTS, BulkJobKind.REARM_DELIVERIES)


class BulkJobError(EventDropError):
    """The request as a whole is invalid; nothing was done. `field` names what was wrong."""

    def __init__(self, message: str, field: str = "non_field_errors"):
        super().__init__(message)
        self.field = field


# --- the selection -------------------------------------------------------------------------


@dataclass(frozen=True)
class KindSpec:
    """What a kind of job acts on: its rows, the filters that apply, how one row is done."""

    model: type[models.Model]
    action: str  # OperatorActionKind
    filters: frozenset[str]
    breakdown: tuple[tuple[str, str], ...]  # (label, field)


FILTER_NAMES = (
    "source",
    "event_type",
    "status",
    "reason",
    "received_after",
    "received_before",
    "handler",
)

KINDS: dict[str, KindSpec] = {
    BulkJobKind.REPLAY_RAW_EVENTS: KindSpec(
        model=RawEvent,
        action=OperatorActionKind.RAW_EVENT_REPLAY,
        # status: the event's signature status; reason: its rejection reason; handler: events
        # with a delivery to that handler; the window is on received_at (partition pruning).
        filters=frozenset(FILTER_NAMES) | {"delivery_status"},
        breakdown=(
            ("source", "source"),
            ("event type", "event_type"),
            ("status", "signature_status"),
            ("dispatch", "dispatch_status"),
        ),
    ),
    BulkJobKind.REARM_DELIVERIES: KindSpec(
        model=Delivery,
        action=OperatorActionKind.DELIVERY_REARM,
        # status: the delivery's; source, type and window: of its raw event; reason: the
        # class its last error starts with (`Class: message`; the message is not searched).
        filters=frozenset(FILTER_NAMES),
        breakdown=(
            ("source", "raw_event__source"),
            ("event type", "raw_event__event_type"),
            ("status", "status"),
            ("handler", "handler"),
        ),
    ),
    BulkJobKind.REARM_SIDE_EFFECTS: KindSpec(
        model=RecapSideEffect,
        action=OperatorActionKind.SIDE_EFFECT_REARM,
        # status: the side effect's; reason: its last error class; window: created_at.
        filters=frozenset({"status", "reason", "received_after", "received_before"}),
        breakdown=(
            ("status", "status"),
            ("effect", "effect_type"),
            ("last error", "last_error_class"),
        ),
    ),
}


# Each kind's rows are selected by that kind's FilterSet, the one its API list and its admin
# filters use: a job keeps its filter data, the FilterSet selects.
FILTERSETS: dict[str, type] = {
    BulkJobKind.REPLAY_RAW_EVENTS: RawEventFilter,
    BulkJobKind.REARM_DELIVERIES: DeliveryFilter,
    BulkJobKind.REARM_SIDE_EFFECTS: SideEffectFilter,
}


def _filtered(kind: str, filters: dict) -> QuerySet:
    spec = KINDS[kind]
    selection = FILTERSETS[kind](data=filters, queryset=spec.model._default_manager.all())
    if not selection.is_valid():
        name, errors = next(iter(selection.errors.items()))
        raise BulkJobError(str(errors[0]), field=name)
    return selection.qs


def bulk_job_selection(*, job: BulkJob) -> QuerySet:
    """The rows the job acts on, not yet limited by its cursor."""
    if job.target_ids:
        return KINDS[job.kind].model._default_manager.filter(id__in=job.target_ids)
    return _filtered(job.kind, job.filters).filter(id__lte=job.upper_id)


def _eligible(kind: str, rows: QuerySet) -> QuerySet:
    """Of the selection, the rows the domain service will act on (the rest it refuses)."""
    if kind == BulkJobKind.REPLAY_RAW_EVENTS:
        return rows.filter(signature_status=SignatureStatus.VERIFIED).exclude(
            dispatch_status=DispatchStatus.DUPLICATE
        )
    if kind == BulkJobKind.REARM_DELIVERIES:
        return rows.filter(status=DeliveryStatus.DEAD)
    return rows.exclude(status__in=[SideEffectStatus.DONE, SideEffectStatus.PROCESSING])


def _breakdown(kind: str, rows: QuerySet) -> dict:
    """Counts per dimension, from one GROUP BY over every dimension at once."""
    spec = KINDS[kind]
    fields = [field for _, field in spec.breakdown]
    per_dimension: dict[str, Counter] = {label: Counter() for label, _ in spec.breakdown}
    for row in rows.order_by().values(*fields).annotate(rows=Count("id")):
        for label, field in spec.breakdown:
            per_dimension[label][row[field] or EMPTY] += row["rows"]
    return {
        label: [[value, count] for value, count in counts.most_common(BREAKDOWN_TOP)]
        for label, counts in per_dimension.items()
    }


def _clean_filters(kind: str, filters: dict) -> dict:
    spec = KINDS[kind]
    cleaned = {}
    for name, value in filters.items():
        if value in (None, ""):
            continue
        if name not in spec.filters:
            raise BulkJobError(NOT_A_FILTER.format(name=name, kind=kind), field=name)
        cleaned[name] = value.isoformat() if isinstance(value, datetime) else value
    after, before = filters.get("received_after"), filters.get("received_before")
    if after and before and after >= before:
        raise BulkJobError(WINDOW_ORDER, field="received_before")
    if cleaned.get("handler"):
        _check_handler(cleaned["handler"])
    reason = cleaned.get("reason")
    if kind == BulkJobKind.REARM_DELIVERIES and reason and not _ERROR_CLASS.fullmatch(reason):
        raise BulkJobError(NOT_AN_ERROR_CLASS, field="reason")
    return cleaned


def _check_handler(name: str) -> None:
    """A misspelt handler is named, not answered as an empty selection. A handler removed
    since its deliveries were made still selects them (dead ones wait for a re-arm)."""
    registered = sorted(spec.name for spec in all_handlers())
    if name in registered or Delivery.objects.filter(handler=name).exists():
        return
    shown = ", ".join(registered[:10]) + (" …" if len(registered) > 10 else "")
    raise BulkJobError(UNKNOWN_HANDLER.format(name=name, names=shown or "none"), field="handler")


def _time_to_clear(kind: str, eligible: QuerySet) -> list[list]:
    """For each rate-limited handler the job runs: [handler, deliveries, rate, seconds to
    clear them at that rate, whether that is past the replay SLO]. A replay runs every
    handler of each event's type; a re-arm, each delivery's own."""
    per_handler: Counter[str] = Counter()
    if kind == BulkJobKind.REPLAY_RAW_EVENTS:
        sources = all_sources()
        grouped = eligible.order_by().values("source", "event_type").annotate(rows=Count("id"))
        for source, event_type, count in grouped.values_list("source", "event_type", "rows"):
            if source in sources:
                for spec in handlers_for(sources[source].provider, event_type):
                    per_handler[spec.name] += count
    elif kind == BulkJobKind.REARM_DELIVERIES:
        rows = eligible.order_by().values("handler").annotate(rows=Count("id"))
        per_handler.update(dict(rows.values_list("handler", "rows")))
    paced = []
    slo = settings.BULK_JOB_REPLAY_SLO_SECONDS
    for name, count in sorted(per_handler.items()):
        handler = get_handler(name)
        rate = handler_limits(handler).rate if handler is not None else None
        if rate:
            seconds = count / rate
            paced.append([name, count, rate, round(seconds, 1), seconds > slo])
    return paced


def bulk_job_preview(
    *,
    actor: User,
    kind: str,
    via: str,
    filters: dict | None = None,
    target_ids: Sequence[int] = (),
) -> BulkJob:
    """A `previewed` job: the selection's count and breakdown, bounded to what exists now.

    Nothing is touched and nothing enqueued; bulk_job_start runs it. With `target_ids` the
    filters are ignored and every id must exist.
    """
    filters = _clean_filters(kind, filters or {})
    ids = sorted(set(target_ids))
    if len(ids) > MAX_SELECTED_IDS:
        raise BulkJobError(TOO_MANY_IDS.format(count=len(ids), limit=MAX_SELECTED_IDS), field="ids")
    model = KINDS[kind].model
    upper_id = model._default_manager.aggregate(top=Max("id"))["top"] or 0
    job = BulkJob(
        actor=actor,
        actor_username=actor.get_username(),
        kind=kind,
        via=via,
        filters={} if ids else filters,
        target_ids=ids,
        upper_id=upper_id,
    )
    rows = bulk_job_selection(job=job)
    if ids:
        found = set(rows.values_list("id", flat=True))
        missing = [pk for pk in ids if pk not in found]
        if missing:
            shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
            raise BulkJobError(UNKNOWN_IDS.format(ids=shown), field="ids")
    job.total = rows.count()
    if not job.total:
        raise BulkJobError(NOTHING_SELECTED)
    eligible = _eligible(kind, rows)
    job.breakdown = {
        "eligible": eligible.count(),
        "by": _breakdown(kind, rows),
        "paced": _time_to_clear(kind, eligible),
    }
    job.save()
    logger.info(
        "console.bulk_job.previewed",
        extra={"bulk_job_id": job.id, "kind": kind, "actor": job.actor_username, "rows": job.total},
    )
    return job


def _enqueue(job_id: int) -> None:
    from django_q.tasks import async_task

    try:
        async_task(TASK, job_id, group=TASK_GROUP, task_name=f"bulk-job-{job_id}-{time.time_ns()}")
    except Exception as exc:
        # The broker is down: the job stays queued/running and the minute sweep enqueues it
        # again once its heartbeat is stale. Never a lost job, at worst a late one.
        logger.error(
            "console.bulk_job.enqueue_failed",
            extra={"bulk_job_id": job_id, "error": type(exc).__name__},
        )


@transaction.atomic
def bulk_job_start(*, job: BulkJob, actor: User, via: str) -> BulkJob:
    """Queue a previewed job (the click the SLO counts from) and write its operator action.
    Refused in the standby region (every kind writes processing state); the preview, local
    to the region, is not."""
    require_processing_region()
    job = BulkJob.objects.select_for_update().get(pk=job.pk)
    if job.state != BulkJobState.PREVIEWED:
        raise BulkJobError(NOT_PREVIEWED.format(id=job.id, state=job.state))
    if not job.total:
        raise BulkJobError(EMPTY_JOB.format(id=job.id))
    now = timezone.now()
    spec = KINDS[job.kind]
    job.operator_action = OperatorAction.objects.create(
        actor=actor,
        actor_username=actor.get_username(),
        action=spec.action,
        via=via,
        target_model=spec.model._meta.label_lower,
        # The selection lives on the job (it may be 100,000 rows): the action points there.
        target_ids=[],
        requested=job.total,
        note=f"bulk job #{job.id}",
        started_at=now,
    )
    job.state = BulkJobState.QUEUED
    job.started_at = now
    job.heartbeat_at = now
    job.save(update_fields=["operator_action", "state", "started_at", "heartbeat_at"])
    transaction.on_commit(lambda: _enqueue(job.id))
    logger.info(
        "console.bulk_job.started",
        extra={"bulk_job_id": job.id, "actor": actor.get_username(), "rows": job.total},
    )
    return job


@transaction.atomic
def bulk_job_cancel(*, job: BulkJob, actor: User) -> BulkJob:
    """Stop a job after its batch in flight (waits for that batch's commit, at most).

    A previewed job is simply discarded (`cancelled`, nothing was ever started).
    """
    job = BulkJob.objects.select_for_update().get(pk=job.pk)
    if job.state in BULK_JOB_FINAL_STATES or job.state == BulkJobState.CANCELLING:
        raise BulkJobError(ALREADY_FINISHED.format(id=job.id, state=job.state))
    now = timezone.now()
    if job.state == BulkJobState.PREVIEWED:
        job.state = BulkJobState.CANCELLED
        job.finished_at = now
        job.save(update_fields=["state", "finished_at"])
    else:
        job.state = BulkJobState.CANCELLING
        job.save(update_fields=["state"])
        # Started, so it has its operator action (bulk_job_start writes both at once).
        action = job.operator_action
        if action is not None:
            note = CANCEL_REQUESTED.format(
                username=actor.get_username(), at=now.isoformat(timespec="seconds")
            )
            OperatorAction.objects.filter(pk=action.pk).update(note=f"{action.note}; {note}")
    logger.info(
        "console.bulk_job.cancel", extra={"bulk_job_id": job.id, "actor": actor.get_username()}
    )
    return job


# --- running ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowResult:
    id: int
    outcome: str  # ItemOutcome
    detail: str = ""


def _each(rows: Iterable, act: Callable[[object], str]) -> list[RowResult]:
    """Run a per-row service (its own savepoint) on each row; a refusal is that row's."""
    results = []
    for row in rows:
        try:
            detail = act(row)
        except EventDropError as exc:
            # Domain refusals carry constant, payload-free messages: safe to show and store.
            results.append(RowResult(row.pk, ItemOutcome.REFUSED, str(exc)))
        else:
            results.append(RowResult(row.pk, ItemOutcome.OK, detail))
    return results


def _replay(ids: list[int]) -> list[RowResult]:
    counts = raw_events_replay_batch(raw_event_ids=ids)
    found = set(ids)
    if counts.not_found:  # dropped past retention since the batch read its ids
        found = set(RawEvent.objects.filter(id__in=ids).values_list("id", flat=True))
    return [
        RowResult(pk, ItemOutcome.REFUSED, counts.refused[pk])
        if pk in counts.refused
        else RowResult(pk, ItemOutcome.OK)
        for pk in ids
        if pk in found
    ]


def _rearm_side_effects(ids: list[int]) -> list[RowResult]:
    def rearm(row) -> str:
        side_effect_rearm(side_effect=row)
        return ""

    return _each(RecapSideEffect.objects.filter(id__in=ids), rearm)


def _rearm_deliveries(ids: list[int]) -> list[RowResult]:
    # Which of them are dead, locked in this transaction so the answer holds for the call.
    dead = set(
        Delivery.objects.select_for_update()
        .filter(id__in=ids, status=DeliveryStatus.DEAD)
        .values_list("id", flat=True)
    )
    deliveries_rearm_batch(delivery_ids=ids)
    return [
        RowResult(pk, ItemOutcome.OK)
        if pk in dead
        else RowResult(pk, ItemOutcome.REFUSED, DELIVERY_NOT_DEAD.format(id=pk))
        for pk in ids
    ]


ACTS: dict[str, Callable[[list[int]], list[RowResult]]] = {
    BulkJobKind.REPLAY_RAW_EVENTS: _replay,
    BulkJobKind.REARM_DELIVERIES: _rearm_deliveries,
    BulkJobKind.REARM_SIDE_EFFECTS: _rearm_side_effects,
}


def _act(kind: str, ids: list[int], job_id: int) -> list[RowResult]:
    """The batch in one savepoint; should it raise (a bug, a poison row), each row again in
    a savepoint of its own, so that one row's error is that row's alone."""
    try:
        with transaction.atomic():
            return ACTS[kind](ids)
    except DATABASE_UNAVAILABLE:
        raise
    except Exception as exc:
        logger.warning(
            "console.bulk_job.batch_failed",
            extra={"bulk_job_id": job_id, "rows": len(ids), "error": type(exc).__name__},
        )
    results = []
    for pk in ids:
        try:
            with transaction.atomic():
                results.extend(ACTS[kind]([pk]))
        except DATABASE_UNAVAILABLE:
            raise
        except Exception as exc:
            # May quote data: the operator gets the class name and where to look.
            logger.exception(
                "console.bulk_job.row_failed", extra={"bulk_job_id": job_id, "object_id": pk}
            )
            detail = UNEXPECTED_ROW_ERROR.format(error=type(exc).__name__, job_id=job_id)
            results.append(RowResult(pk, ItemOutcome.ERROR, detail))
    return results


def _outcome(job: BulkJob) -> str:
    if job.state == BulkJobState.CANCELLED:
        return OperatorActionOutcome.CANCELLED
    if job.succeeded and not (job.refused or job.failed):
        return OperatorActionOutcome.SUCCEEDED
    if job.succeeded:
        return OperatorActionOutcome.PARTIAL
    if job.failed:
        return OperatorActionOutcome.FAILED
    if job.refused:
        return OperatorActionOutcome.REFUSED
    # Every previewed row had stopped matching by the time its batch came: nothing to do.
    return OperatorActionOutcome.SUCCEEDED


def _finish(job: BulkJob, state: str, now: datetime) -> None:
    """Final state and the operator action's final counts, in the caller's transaction."""
    job.state = state
    job.finished_at = now
    job.heartbeat_at = now
    job.save(update_fields=["state", "finished_at", "heartbeat_at", "error"])
    requested = max(job.total, job.processed)
    if job.operator_action_id is None:  # a preview is discarded without one (bulk_job_cancel)
        return
    OperatorAction.objects.filter(id=job.operator_action_id).update(
        requested=requested,
        succeeded=job.succeeded,
        refused=job.refused,
        failed=job.failed,
        skipped=requested - job.processed,
        outcome=_outcome(job),
        results=job.problems,
        finished_at=now,
    )
    logger.info(
        "console.bulk_job.finished",
        extra={
            "bulk_job_id": job.id,
            "state": str(state),
            "processed": job.processed,
            "succeeded": job.succeeded,
            "refused": job.refused,
            "failed": job.failed,
            "batches": job.batches,
        },
    )


def _run_batch(job_id: int, batch_size: int) -> bool:
    """One batch in one transaction. True when the job has more to do."""
    with transaction.atomic():
        job = BulkJob.objects.select_for_update().get(pk=job_id)
        now = timezone.now()
        if job.state in BULK_JOB_FINAL_STATES or job.state == BulkJobState.PREVIEWED:
            return False
        if job.state == BulkJobState.CANCELLING:
            _finish(job, BulkJobState.CANCELLED, now)
            return False
        ids = list(
            bulk_job_selection(job=job)
            .filter(id__gt=job.cursor)
            .order_by("id")
            .values_list("id", flat=True)[:batch_size]
        )
        if not ids:
            _finish(job, BulkJobState.DONE, now)
            return False
        # Asked before every batch: the processing region may have moved since the start.
        require_processing_region()
        results = _act(job.kind, ids, job.id)
        counts = Counter(result.outcome for result in results)
        job.cursor = ids[-1]
        job.batches += 1
        job.processed += len(results)
        job.succeeded += counts[ItemOutcome.OK]
        job.refused += counts[ItemOutcome.REFUSED]
        job.failed += counts[ItemOutcome.ERROR]
        room = MAX_PROBLEMS - len(job.problems)
        if room > 0:
            job.problems += [
                {"id": r.id, "outcome": r.outcome, "detail": r.detail}
                for r in results
                if r.outcome != ItemOutcome.OK
            ][:room]
        job.heartbeat_at = now
        # Not the state (but the first batch's queued -> running): the row is locked, and
        # only an operator's cancel, in this very transaction, could have changed it.
        fields = ["cursor", "batches", "processed", "succeeded", "refused", "failed"]
        job.save(update_fields=[*fields, "problems", "heartbeat_at"])
        BulkJob.objects.filter(pk=job.pk, state=BulkJobState.QUEUED).update(
            state=BulkJobState.RUNNING
        )
        if job.kind in SLO_KINDS:  # the rows the replay SLO is measured over
            BulkJobItem.objects.bulk_create(
                [BulkJobItem(job_id=job.id, target_id=r.id) for r in results if r.outcome == "ok"],
                ignore_conflicts=True,
            )
    return True


def _fail(job_id: int, exc: Exception, *, error: str = "") -> None:
    with transaction.atomic():
        job = BulkJob.objects.select_for_update().get(pk=job_id)
        if job.state in BULK_JOB_FINAL_STATES:
            return
        job.error = error or JOB_FAILED.format(
            error=type(exc).__name__, batch=job.batches + 1, job_id=job.id
        )
        _finish(job, BulkJobState.FAILED, timezone.now())


def bulk_job_run(
    *, job_id: int, budget_seconds: float | None = None, batch_size: int | None = None
) -> BulkJob:
    """Run batches until the job ends or the task's budget is spent (then continue later).

    Safe to call any number of times, also concurrently, for the same job (see the module
    docstring): a finished job is left as it is.
    """
    budget = settings.BULK_JOB_TASK_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    size = batch_size or settings.BULK_JOB_BATCH_SIZE
    deadline = time.monotonic() + budget
    while True:
        try:
            more = _run_batch(job_id, size)
        except DATABASE_UNAVAILABLE:
            # Transient: the job stays as it is; the sweep resumes it (no silent finality).
            raise
        except ProcessingWritesRefused as exc:
            if exc.retry_after:
                raise  # a switch to this region under way: as transient, the sweep resumes it
            # This region became the standby: the job ends here, saying where to run the
            # rest (a new job there selects what this one did not reach).
            logger.warning("console.bulk_job.standby", extra={"bulk_job_id": job_id})
            _fail(job_id, exc, error=str(exc))
            break
        except Exception as exc:
            logger.exception("console.bulk_job.failed", extra={"bulk_job_id": job_id})
            _fail(job_id, exc)
            break
        if not more:
            break
        if time.monotonic() >= deadline:
            _enqueue(job_id)
            break
    return BulkJob.objects.get(pk=job_id)


# --- the sweep: resume stalled jobs, measure the SLO, prune -------------------------------------


def bulk_jobs_resume_stale(*, now: datetime | None = None) -> list[int]:
    """Enqueue again every active job whose heartbeat stopped (its worker died or the
    message was lost). A job that is in fact still running just takes turns with it."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.BULK_JOB_STALE_SECONDS)
    stale = list(
        BulkJob.objects.filter(
            state__in=BULK_JOB_ACTIVE_STATES, heartbeat_at__lt=cutoff
        ).values_list("id", flat=True)
    )
    for job_id in stale:
        BulkJob.objects.filter(pk=job_id).update(heartbeat_at=now)
        _enqueue(job_id)
    if stale:
        logger.warning("console.bulk_job.resumed_stale", extra={"jobs": len(stale)})
    return stale


@dataclass(frozen=True)
class SloMeasurement:
    events: int  # acted-on rows that had a handler to run
    within: int  # of those, handled within the SLO window of the click
    p99_seconds: float | None  # None: the 99th percentile was not handled when measured


def _chunks(values: list[int], size: int) -> Iterable[list[int]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def _first_done(delivery_ids: list[int], since: datetime) -> dict[int, datetime]:
    return dict(
        DeliveryAttempt.objects.filter(
            delivery_id__in=delivery_ids,
            outcome=DeliveryAttempt.Outcome.DONE,
            finished_at__gte=since,
        )
        .values("delivery_id")
        .annotate(first=Min("finished_at"))
        .values_list("delivery_id", "first")
    )


def bulk_job_replay_latencies(*, job: BulkJob) -> list[float | None]:
    """Seconds from the click to each acted-on row's handling (None: not handled yet).

    A replayed event is handled when every one of its deliveries has a `done` attempt after
    the click; a re-armed delivery when it has one. Rows without a delivery are left out.
    """
    since = job.started_at
    if since is None:  # never started: nothing was replayed
        return []
    latencies: list[float | None] = []
    items = list(
        BulkJobItem.objects.filter(job=job)
        .order_by("target_id")
        .values_list("target_id", flat=True)
    )
    for chunk in _chunks(items, SLO_CHUNK):
        if job.kind == BulkJobKind.REPLAY_RAW_EVENTS:
            pairs = list(
                Delivery.objects.filter(raw_event_id__in=chunk).values_list("id", "raw_event_id")
            )
        else:
            pairs = [
                (pk, pk)
                for pk in Delivery.objects.filter(id__in=chunk).values_list("id", flat=True)
            ]
        done = _first_done([delivery_id for delivery_id, _ in pairs], since)
        per_row: dict[int, list[datetime]] = {}
        unhandled: set[int] = set()
        for delivery_id, row_id in pairs:
            first = done.get(delivery_id)
            per_row.setdefault(row_id, [])
            if first is None:
                unhandled.add(row_id)
            else:
                per_row[row_id].append(first)
        for row_id, times in per_row.items():
            latencies.append(None if row_id in unhandled else (max(times) - since).total_seconds())
    return latencies


def slo_measurement(latencies: list[float | None], *, window_seconds: float) -> SloMeasurement:
    """Nearest-rank p99, with rows not yet handled ranked last (they are the slowest)."""
    handled = sorted(value for value in latencies if value is not None)
    events = len(latencies)
    within = sum(1 for value in handled if value <= window_seconds)
    p99 = None
    if events:
        rank = math.ceil(SLO_PERCENTILE * events)
        if rank <= len(handled):
            p99 = handled[rank - 1]
    return SloMeasurement(events=events, within=within, p99_seconds=p99)


def bulk_job_measure_slo(*, job: BulkJob, now: datetime | None = None) -> BulkJob:
    now = now or timezone.now()
    measured = slo_measurement(
        bulk_job_replay_latencies(job=job), window_seconds=settings.BULK_JOB_REPLAY_SLO_SECONDS
    )
    BulkJob.objects.filter(pk=job.pk).update(
        slo_measured_at=now,
        slo_events=measured.events,
        slo_within=measured.within,
        slo_p99_seconds=measured.p99_seconds,
    )
    job.refresh_from_db()
    logger.info(
        "console.bulk_job.slo_measured",
        extra={"bulk_job_id": job.id, "events": measured.events, "within": measured.within},
    )
    return job


def bulk_jobs_measure_slo(*, now: datetime | None = None) -> int:
    """Measure every finished replay job whose SLO window (from the click) has passed.

    Measured once: by then an event not handled has missed the SLO whatever happens later.
    """
    now = now or timezone.now()
    window = timedelta(seconds=settings.BULK_JOB_REPLAY_SLO_SECONDS)
    jobs = BulkJob.objects.filter(
        kind__in=SLO_KINDS,
        state__in=BULK_JOB_FINAL_STATES,
        started_at__isnull=False,
        started_at__lte=now - window,
        slo_measured_at__isnull=True,
    ).exclude(operator_action__isnull=True)
    count = 0
    for job in jobs:
        bulk_job_measure_slo(job=job, now=now)
        count += 1
    BulkJobItem.objects.filter(job__slo_measured_at__lt=now - ITEM_RETENTION).delete()
    return count


def bulk_jobs_sweep() -> None:
    """The minute schedule (kernel/schedules.py); it also prunes the figures' roll-ups."""
    bulk_jobs_resume_stale()
    bulk_jobs_measure_slo()
    now = timezone.now()
    ack_rollup_prune(now=now)
    VolumeBucket.objects.filter(bucket__lt=now - VOLUME_RETENTION).delete()


# --- reads for the pages, the API, the ops page and /metrics -----------------------------------


def bulk_job_list() -> QuerySet[BulkJob]:
    return BulkJob.objects.select_related("operator_action").defer("target_ids")


@dataclass(frozen=True)
class ReplaySlo:
    """The replay SLO over the jobs measured in a window: the ops page's and /metrics' figure."""

    jobs: int
    events: int
    within: int
    worst_p99_seconds: float | None

    @property
    def missed_ratio(self) -> float | None:
        if not self.events:
            return None
        return (self.events - self.within) / self.events


def replay_slo(*, now: datetime, window: timedelta) -> ReplaySlo:
    """One aggregate over the jobs measured in the window (the bulkjob_slo_measured index)."""
    row = BulkJob.objects.filter(
        slo_measured_at__gte=now - window, slo_measured_at__lte=now, slo_events__gt=0
    ).aggregate(
        jobs=Count("id"),
        events=Sum("slo_events"),
        within=Sum("slo_within"),
        worst=Max("slo_p99_seconds"),
        # A job whose p99 was not handled when measured is the worst there is.
        unreached=Count("id", filter=Q(slo_p99_seconds__isnull=True)),
    )
    return ReplaySlo(
        jobs=row["jobs"],
        events=row["events"] or 0,
        within=row["within"] or 0,
        worst_p99_seconds=None if row["unreached"] else row["worst"],
    )


def bulk_jobs_active_counts() -> dict[str, int]:
    counts = dict.fromkeys(BULK_JOB_ACTIVE_STATES, 0)
    for state, rows in (
        BulkJob.objects.filter(state__in=BULK_JOB_ACTIVE_STATES)
        .values_list("state")
        .annotate(rows=Count("id"))
        .order_by()
    ):
        counts[state] = rows
    return {str(state): rows for state, rows in counts.items()}
