"""New deliveries: one per (event, handler), built when the inbox settles an event, and run at
once in that settle's transaction when nothing needs the claim (docs/flows.md, "Run at
settle")."""

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection
from django.utils import timezone

from ingress.deliveries.pace import handler_limits
from ingress.deliveries.statements import SETTLE_RUN_INSERT
from ingress.handlers import HandlerSpec, handler_note
from ingress.models import (
    Delivery,
    DeliveryAttempt,
    DeliveryStatus,
    HandlerPace,
    HandlerPause,
    RawEvent,
)
from ingress.payloads import parse_payload, raw_event_body, raw_event_headers
from kernel import tracing
from kernel.db.json_rows import json_rows
from kernel.queue import statement, this_process


def deliveries_for_event(
    event: RawEvent, specs: list[HandlerSpec], now: datetime
) -> list[Delivery]:
    """The new (unsaved) deliveries of a settled event, one per handler, due now.

    An ordered handler's carries the event's ordering key and event time, read from the
    payload (parsed once per event, and only when some handler orders).
    """
    ordering: dict[str, tuple[str, datetime | None]] = {}
    if any(spec.ordered for spec in specs):
        try:
            payload = parse_payload(raw_event_headers(event), raw_event_body(event))
        except Exception:
            # Unreadable: delivered unordered, and its handler says why (a permanent error).
            payload = None
        ordering = {spec.name: spec.ordering_of(payload) for spec in specs if spec.ordered}
    paused: set[str] = set()
    if any(key for key, _ in ordering.values()):
        # An ordered delivery a pause covers is created `held`: created pending behind its
        # key's held head it would wait unseen (the claim looks at a key's head only).
        pauses = HandlerPause.objects.filter(resumed_at__isnull=True)
        paused = {
            spec.name
            for handler, source in pauses.values_list("handler", "source")
            for spec in specs
            if spec.name == handler or source == event.source
        }
    deliveries = []
    for spec in specs:
        key, event_time = ordering.get(spec.name, ("", None))
        deliveries.append(
            Delivery(
                raw_event_id=event.id,
                handler=spec.name,
                status=DeliveryStatus.HELD
                if key and spec.name in paused
                else DeliveryStatus.PENDING,
                next_attempt_at=now,
                ordering_key=key,
                event_time=(event_time or event.received_at) if key else None,
            )
        )
    return deliveries


# --- run at settle ---------------------------------------------------------------------------

# A handler that raised at settle is left to the claim this long, so that a handler failing
# for every event does not run twice per event.
SETTLE_RUN_COOLDOWN_SECONDS = 60.0


@dataclass
class SettleRunCooldown:
    """This process's cost decision: which handlers run at settle now (never a verdict)."""

    handlers: dict[str, float] = field(default_factory=dict)  # handler -> monotonic deadline
    everything_until: float = 0.0


def settle_run_cooldown() -> SettleRunCooldown:
    memo = this_process().memo
    cooldown: SettleRunCooldown = memo.setdefault("deliveries.settle_run", SettleRunCooldown())
    return cooldown


def deliveries_settle_run_rest() -> None:
    """No handler runs at settle in this process for a while (a settle batch failed at COMMIT)."""
    settle_run_cooldown().everything_until = time.monotonic() + SETTLE_RUN_COOLDOWN_SECONDS


def deliveries_runnable_at_settle(
    routed: list[tuple[RawEvent, list[HandlerSpec]]],
) -> list[tuple[RawEvent, list[HandlerSpec]]]:
    """The (event, handlers) among freshly settled ones whose handlers may run at settle:
    every handler unordered and unlimited (a rate or a concurrency is the claim's to keep),
    none paused, slowed by its downstream or cooling down. One read of the active pauses and
    slow-downs, only if any event qualifies otherwise."""
    cooldown = settle_run_cooldown()
    clock = time.monotonic()
    if clock < cooldown.everything_until:
        return []
    cooled = {name for name, until in cooldown.handlers.items() if clock < until}
    candidates = [
        (event, specs)
        for event, specs in routed
        if specs
        and not any(
            spec.ordered or spec.name in cooled or handler_limits(spec).limited for spec in specs
        )
    ]
    if not candidates:
        return []
    pauses = list(
        HandlerPause.objects.filter(resumed_at__isnull=True).values_list("handler", "source")
    )
    slowed = set(
        HandlerPace.objects.filter(not_before__gt=timezone.now()).values_list("handler", flat=True)
    )
    if not pauses and not slowed:
        return candidates
    handlers = {handler for handler, _ in pauses if handler} | slowed
    sources = {source for _, source in pauses if source}
    return [
        (event, specs)
        for event, specs in candidates
        if event.source not in sources and not any(spec.name in handlers for spec in specs)
    ]


class SettleRunRaised(Exception):
    """A handler raised while run at settle: the caller rolls the run back to its savepoint
    and inserts the deliveries `pending` instead."""


def deliveries_run_at_settle(
    runnable: list[tuple[RawEvent, list[HandlerSpec]]],
    now: datetime,
    *,
    parents: Mapping[int, str] | None = None,
) -> datetime:
    """Run these events' handlers in the caller's transaction and savepoint, and insert their
    deliveries `done` with one `done` attempt each. Returns when they finished (the events'
    handled_at). Raises SettleRunRaised (its cause the handler's exception) once a handler
    raises; the caller rolls back the savepoint.
    """
    # event id, handler, started, finished, the handler's note, the delivery's traceparent
    runs: list[tuple[int, str, datetime, datetime, str, str]] = []
    clock = timezone.now()  # one reading between two handlers: the one's end, the next's start
    for event, specs in runnable:
        payload = None
        parent = (parents or {}).get(event.id, "")
        for spec in specs:
            started = clock
            try:
                # `parents`: each event's verify span (kernel/tracing.py).
                with tracing.span(
                    "webhook deliver",
                    parent=parent,
                    attributes={"eventdrop.handler": spec.name, "eventdrop.attempt": 1},
                ):
                    if payload is None:
                        payload = parse_payload(raw_event_headers(event), raw_event_body(event))
                    note = handler_note(spec.func(event, payload))
            except Exception as exc:
                cooling = time.monotonic() + SETTLE_RUN_COOLDOWN_SECONDS
                settle_run_cooldown().handlers[spec.name] = cooling
                raise SettleRunRaised(spec.name) from exc
            clock = timezone.now()
            runs.append((event.id, spec.name, started, clock, note, parent))
    finished = runs[-1][3]
    sql = statement(
        SETTLE_RUN_INSERT,
        Delivery._meta.db_table,
        attempt=connection.ops.quote_name(DeliveryAttempt._meta.db_table),
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            [
                json_rows(
                    ("raw_event_id", "handler", "started_at", "finished_at", "note", "traceparent"),
                    runs,
                ),
                DeliveryStatus.DONE,
                now,
                runs[0][2],
                now,
                finished,
                DeliveryAttempt.Outcome.DONE,
            ],
        )
        if cursor.rowcount != len(runs):
            # A delivery of a pending event already existed (a conflict): not ours to finish.
            raise SettleRunRaised(f"inserted {cursor.rowcount} of {len(runs)} deliveries")
    return finished
