"""An operator's hand on deliveries (called by ingress/services.py): pauses hold them and
resumes release them, replays and re-arms arm them afresh."""

from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import Exists, F, OuterRef, QuerySet

from ingress.deliveries.create import deliveries_for_event
from ingress.deliveries.statements import RELEASE_HELD
from ingress.handlers import handlers_for
from ingress.models import Delivery, DeliveryStatus, HandlerPause, RawEvent
from kernel.queue import Claim, statement


def _in_scope(rows: QuerySet[Delivery], *, handler: str, source: str) -> QuerySet[Delivery]:
    """A pause's deliveries: one handler's, or every handler's for one source's events."""
    if handler:
        return rows.filter(handler=handler)
    return rows.filter(Exists(RawEvent.objects.filter(id=OuterRef("raw_event_id"), source=source)))


def deliveries_hold(*, handler: str = "", source: str = "") -> int:
    """Pending deliveries in a new pause's scope become `held` (the claim holds any that
    turn pending later). Returns how many. Inside the caller's transaction."""
    return _in_scope(
        Delivery.objects.filter(status=DeliveryStatus.PENDING), handler=handler, source=source
    ).update(status=DeliveryStatus.HELD)


def deliveries_release(
    *, handler: str = "", source: str = "", now: datetime, per_second: float
) -> int:
    """Held deliveries in a pause's scope back to `pending`, due one after another in
    received order (raw event id, the order of the store's INSERTs), `per_second` of them
    per second: the claim takes due deliveries oldest first, so the backlog runs in that
    order at that rate beside the live traffic. One UPDATE. Returns how many."""
    scoped = _in_scope(
        Delivery.objects.filter(status=DeliveryStatus.HELD), handler=handler, source=source
    )
    rows = list(scoped.order_by("raw_event_id", "id").values_list("id", "raw_event_id", "handler"))
    # What another active pause still covers stays held (and counted as held): released
    # now, it would only be held again when due, and show as pending meanwhile.
    still_paused = paused_among(rows, besides=(handler, source))
    ids = [delivery_id for delivery_id, _, _ in rows if delivery_id not in still_paused]
    if not ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            statement(RELEASE_HELD, Delivery._meta.db_table),
            [now, float(per_second), ids],
        )
        return cursor.rowcount


# A delivery armed afresh (a replay, a re-arm of a dead one): no claim, no finish, fresh
# attempts, and neither its horizon nor an uncharged wait started.
_ARMED_AFRESH = {
    "attempts": 0,
    "worker_deaths": 0,
    "claimed_at": None,
    "claimed_by": None,
    "finished_at": None,
    "first_failed_at": None,
    "waiting_since": None,
}

# What a replay arms again. `pending` is re-armed too (attempts reset, due now): a replay is
# the operator's "try it now", and it stays one row, so a second replay queues nothing twice.
# `processing` is left to finish on its own, `held` to its pause; `superseded` is re-armed
# only by force, and then runs despite the newer event of its key.
_REPLAY_REARMS = (DeliveryStatus.DONE, DeliveryStatus.DEAD, DeliveryStatus.PENDING)


@dataclass(frozen=True)
class ReplayArming:
    armed_by_event: dict[int, int]  # raw event id -> deliveries (re)armed, new ones included
    already_queued: int  # deliveries left as they were (running, or held by a pause)
    superseded_kept: int  # superseded deliveries a replay without force leaves alone


def deliveries_arm_for_replay(
    events: list[RawEvent], *, force: bool, now: datetime
) -> ReplayArming:
    """(Re)arm every delivery of these verified events, inside the caller's transaction.

    A delivery is created for each handler registered since the event was settled; the
    existing ones are re-armed with their attempts reset, in one UPDATE for the batch. An
    ordered handler's re-armed delivery takes its turn in its key again: it runs if no newer
    event of the key was handled meanwhile, else it is superseded — unless `force`, which
    re-arms superseded ones too and runs them regardless (still one at a time per key).
    """
    if not events:
        return ReplayArming({}, 0, 0)
    rows = Delivery.objects.filter(raw_event_id__in=[e.id for e in events])
    existing = list(rows.values_list("raw_event_id", "handler", "status"))
    already_queued = sum(
        status in (DeliveryStatus.PROCESSING, DeliveryStatus.HELD) for *_, status in existing
    )
    superseded = sum(status == DeliveryStatus.SUPERSEDED for *_, status in existing)
    rearms = (*_REPLAY_REARMS, DeliveryStatus.SUPERSEDED) if force else _REPLAY_REARMS
    # Only the rows to re-arm are locked, in id order: a running delivery is never waited
    # for (its batch, which also stamps the event handled, would wait for our event lock).
    armed = list(
        rows.filter(status__in=rearms)
        .select_for_update()
        .order_by("id")
        .values_list("id", "raw_event_id", "handler")
    )
    armed_ids = [(delivery_id, raw_event_id) for delivery_id, raw_event_id, _ in armed]
    # What an active pause covers is armed `held` at once: visible and counted as held, and
    # an ordered key's later deliveries are not left pending behind a held head (the claim
    # would never reach them to hold them: only a key's head is looked at).
    paused = paused_among(armed)
    for status, ids in (
        (DeliveryStatus.PENDING, [i for i, _ in armed_ids if i not in paused]),
        (DeliveryStatus.HELD, [i for i, _ in armed_ids if i in paused]),
    ):
        if ids:
            Delivery.objects.filter(id__in=ids).update(
                status=status,
                next_attempt_at=now,
                superseded_by=None,
                forced=force,
                **_ARMED_AFRESH,
            )
    handled = {(event_id, handler) for event_id, handler, _ in existing}
    new: list[Delivery] = []
    for event in events:
        specs = [
            spec
            for spec in handlers_for(event.provider, event.event_type)
            if (event.id, spec.name) not in handled
        ]
        new += deliveries_for_event(event, specs, now)
    held_new = paused_among([(n, d.raw_event_id, d.handler) for n, d in enumerate(new)])
    for n in held_new:
        new[n].status = DeliveryStatus.HELD
    # ignore_conflicts: a settle of the same event that created the row since our read wins
    # (then it is pending and due already).
    Delivery.objects.bulk_create(new, ignore_conflicts=True)
    armed_by_event: dict[int, int] = {}
    for _, raw_event_id in armed_ids:
        armed_by_event[raw_event_id] = armed_by_event.get(raw_event_id, 0) + 1
    for delivery in new:
        armed_by_event[delivery.raw_event_id] = armed_by_event.get(delivery.raw_event_id, 0) + 1
    return ReplayArming(armed_by_event, already_queued, 0 if force else superseded)


def deliveries_rearm_dead(delivery_ids: list[int], *, now: datetime) -> int:
    """Dead deliveries back to `pending`, attempts reset; the others untouched. Returns how
    many. Inside the caller's transaction."""
    dead = Delivery.objects.filter(id__in=delivery_ids, status=DeliveryStatus.DEAD)
    # The events first, then their deliveries: the order a replay locks them in, so that a
    # replay and a re-arm of the same events never deadlock.
    events = dead.values("raw_event_id")
    list(RawEvent.objects.select_for_update().filter(id__in=events).order_by("id").values("id"))
    locked = list(
        dead.select_for_update().order_by("id").values_list("id", "raw_event_id", "handler")
    )
    rows = [(delivery_id, raw_event_id) for delivery_id, raw_event_id, _ in locked]
    paused = paused_among(locked)  # armed held, as a replay arms them (see there)
    for status, ids in (
        (DeliveryStatus.PENDING, [i for i, _ in rows if i not in paused]),
        (DeliveryStatus.HELD, [i for i, _ in rows if i in paused]),
    ):
        if ids:
            Delivery.objects.filter(id__in=ids).update(
                status=status, next_attempt_at=now, **_ARMED_AFRESH
            )
    # The event is no longer handled: its lag shows again until the delivery finishes.
    RawEvent.objects.filter(id__in={raw_event_id for _, raw_event_id in rows}).update(
        handled_at=None
    )
    return len(rows)


def paused_among(
    rows: list[tuple[int, int, str]], *, besides: tuple[str, str] | None = None
) -> set[int]:
    """The ids among (delivery id, raw event id, handler) that an active pause covers (any
    but the (handler, source) pause `besides`, the one being resumed)."""
    if not rows:
        return set()
    active = HandlerPause.objects.filter(resumed_at__isnull=True)
    if besides is not None:
        active = active.exclude(handler=besides[0], source=besides[1])
    pauses = list(active.values_list("handler", "source"))
    if not pauses:
        return set()
    handlers = {handler for handler, _ in pauses if handler}
    sources = {source for _, source in pauses if source}
    paused_events: set[int] = set()
    if sources:
        paused_events = set(
            RawEvent.objects.filter(
                id__in={row[1] for row in rows}, source__in=sources
            ).values_list("id", flat=True)
        )
    return {
        delivery_id
        for delivery_id, raw_event_id, handler in rows
        if handler in handlers or raw_event_id in paused_events
    }


def hold_paused(rows: list[tuple]) -> list[tuple]:
    """Hold the locked pending rows (id, raw event id, handler, …) that a pause covers (a
    key's head: its key waits for the resume); returns the others."""
    held = paused_among([(row[0], row[1], row[2]) for row in rows])
    if not held:
        return rows
    Delivery.objects.filter(id__in=held).update(status=DeliveryStatus.HELD)
    return [row for row in rows if row[0] not in held]


def hold_claimed_paused(claims: list[Claim]) -> list[Claim]:
    """Hold the just-claimed deliveries a pause covers, their attempt given back; returns the
    others. Whatever made them pending (created before the pause was seen, a retry, a replay,
    an orphan re-armed), a paused handler never runs."""
    held = paused_among([(c.id, c.row["raw_event_id"], c.row["handler"]) for c in claims])
    if not held:
        return claims
    Delivery.objects.filter(id__in=held).update(
        status=DeliveryStatus.HELD,
        claimed_at=None,
        claimed_by=None,
        attempts=F("attempts") - 1,
        total_attempts=F("total_attempts") - 1,
    )
    return [claim for claim in claims if claim.id not in held]
