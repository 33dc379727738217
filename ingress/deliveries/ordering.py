"""Ordered handlers: one delivery per key at a time, never an older after a newer
(docs/ordering.md).

A key's head is its oldest unfinished delivery (held ones included), by (event_time,
raw_event_id). Only a head that is pending and due is claimed, and only under its key's
transaction-level advisory lock, tried (the SKIP LOCKED of keys). Under the lock a fresh
statement sees every claim committed before it: a key with a running delivery, or whose head
changed, waits; a head older than the key's newest handled delivery is superseded instead.
"""

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from django.db import connection
from django.db.backends.utils import CursorWrapper

from ingress.deliveries.holds import hold_paused
from ingress.deliveries.statements import KEY_HEADS, KEY_HEADS_SKIP_SCAN, KEY_LOCKS, KEY_STATE
from ingress.models import Delivery, DeliveryStatus
from kernel.queue import statement, this_process

# The advisory lock space of the keys: pg_try_advisory_xact_lock(ORDERING_LOCK_CLASS,
# hashtext(handler || ' ' || key)). A hash collision only makes two keys wait for each other
# within one claim.
ORDERING_LOCK_CLASS = 0x6F72_6465  # b"orde"
# The skip scan walks at most this many keys; past that the sorted read is cheaper, and is
# used for SORTED_READ_PASSES passes before the next walk (bench/ordered_claim.py).
SKIP_SCAN_MAX_KEYS = 200
SORTED_READ_PASSES = 20

logger = logging.getLogger(__name__)


class KeyHead(NamedTuple):
    id: int
    raw_event_id: int
    handler: str
    ordering_key: str
    event_time: datetime
    forced: bool
    worker_deaths: int


@dataclass
class HeadReadChoice:
    """This process's cost decision: the skip scan, or the sorted read for a while."""

    sorted_passes_left: int = 0


def head_read_choice() -> HeadReadChoice:
    memo = this_process().memo
    choice: HeadReadChoice = memo.setdefault("deliveries.head_read", HeadReadChoice())
    return choice


def key_head_candidates(cursor: CursorWrapper, limit: int, now: datetime) -> list[int]:
    """The ids of up to `limit` key heads that are pending and due, the longest due first."""
    table = Delivery._meta.db_table
    choice = head_read_choice()
    if choice.sorted_passes_left <= 0:
        cursor.execute(statement(KEY_HEADS_SKIP_SCAN, table), [SKIP_SCAN_MAX_KEYS, now])
        rows = cursor.fetchall()
        if not rows or rows[-1][3] <= SKIP_SCAN_MAX_KEYS:  # the walk saw every key
            due = sorted((at, id) for id, claimable, at, _ in rows if claimable)
            return [id for _, id in due[:limit]]
        choice.sorted_passes_left = SORTED_READ_PASSES  # more keys than the walk takes
    choice.sorted_passes_left -= 1
    cursor.execute(statement(KEY_HEADS, table), [now, limit])
    return [row[0] for row in cursor.fetchall()]


@dataclass(frozen=True)
class KeyHeads:
    claimable: list[KeyHead]  # locked, pending, their keys locked: the caller claims them
    superseded: set[int]  # raw events of the heads superseded instead


def key_heads_to_claim(limit: int, now: datetime) -> KeyHeads:
    """The heads of ordering keys to claim now, inside the caller's transaction."""
    with connection.cursor() as cursor:
        candidates = key_head_candidates(cursor, limit, now)
    if not candidates:
        return KeyHeads([], set())
    rows = list(
        Delivery.objects.select_for_update(skip_locked=True)
        .filter(id__in=candidates, status=DeliveryStatus.PENDING)
        .order_by("next_attempt_at")
        .values_list(*KeyHead._fields)
    )
    heads = [KeyHead(*row) for row in hold_paused(rows)]
    if not heads:
        return KeyHeads([], set())
    table = Delivery._meta.db_table
    with connection.cursor() as cursor:
        handlers, keys = [h.handler for h in heads], [h.ordering_key for h in heads]
        cursor.execute(KEY_LOCKS, [ORDERING_LOCK_CLASS, handlers, keys])
        locked = [heads[n - 1] for n, got in cursor.fetchall() if got]
        if not locked:
            return KeyHeads([], set())
        handlers, keys = [h.handler for h in locked], [h.ordering_key for h in locked]
        cursor.execute(statement(KEY_STATE, table), [handlers, keys])
        state = {(h, k, status): (i, t, e) for h, k, status, i, t, e in cursor.fetchall()}
    claimable, superseded = [], []
    for head in locked:
        if (head.handler, head.ordering_key, DeliveryStatus.PROCESSING) in state:
            continue  # one of the key's deliveries is running
        pending = state.get((head.handler, head.ordering_key, DeliveryStatus.PENDING))
        if pending is None or pending[0] != head.id:
            continue  # an older one arrived since the candidates were read: next pass
        newest = state.get((head.handler, head.ordering_key, DeliveryStatus.DONE))
        if (
            newest is not None
            and not head.forced
            and newest[1:]
            > (
                head.event_time,
                head.raw_event_id,
            )
        ):
            superseded.append((head, newest[0]))
            continue
        claimable.append(head)
    for head, newer_id in superseded:
        # Finished without running, visibly: with the delivery it lost to.
        Delivery.objects.filter(id=head.id).update(
            status=DeliveryStatus.SUPERSEDED, superseded_by_id=newer_id, finished_at=now
        )
        logger.info(
            "ingress.deliver.superseded",
            extra={"delivery_id": head.id, "raw_event_id": head.raw_event_id, "by": newer_id},
        )
    return KeyHeads(claimable, {head.raw_event_id for head, _ in superseded})


def heads_within_shares(
    heads: list[KeyHead], shares: dict[str, int], *, taken: dict[str, int]
) -> list[KeyHead]:
    """The heads to claim in turns across their handlers (each handler's oldest due first),
    each handler within its share left after the unordered claims took theirs."""
    left = {name: share - taken.get(name, 0) for name, share in shares.items()}
    turns: dict[str, int] = {}
    ranked = []
    for position, head in enumerate(heads):
        turn = turns[head.handler] = turns.get(head.handler, 0) + 1
        if turn <= left.get(head.handler, turn):
            ranked.append((turn, position, head))
    return [head for _, _, head in sorted(ranked)]


def suspects_alone(
    heads: list[KeyHead], *, beside_suspect: bool, beside_any: bool
) -> list[KeyHead]:
    """The key heads to claim beside the unordered claims just made, so that a delivery with
    worker deaths is claimed alone: none beside a suspect; beside others, the heads up to
    the first suspect; alone, a suspect first in line by itself. The heads left out wait for
    a later pass (their keys' locks end with the claim's transaction)."""
    if beside_suspect:
        return []
    if heads and heads[0].worker_deaths > 0 and not beside_any:
        return heads[:1]
    prefix = []
    for head in heads:
        if head.worker_deaths > 0:
            break
        prefix.append(head)
    return prefix
