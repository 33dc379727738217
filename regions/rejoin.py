"""region_setup --rejoin: a region that returns after another took processing over lists the
state it wrote and never sent (its tail), then re-copies its state tables from the processing
region (docs/multi-region.md, "Rejoin").
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

from regions import replication
from regions.configuration import ID_BLOCK_BITS, Peer, id_block_start, peers, region_name
from regions.models import RegionState
from regions.selectors import effective_decision
from regions.setup import (
    PEER_CONNECT_TIMEOUT_SECONDS,
    PEER_UNREACHABLE,
    RegionSetupError,
    SetupReport,
)

REJOIN_IN_PROCESSING_REGION = (
    "This region is the processing region (epoch {epoch}): rejoin repairs a region that "
    "returns after another took processing over; there is nothing to rejoin here."
)
REJOIN_NO_DECISION = "No processing decision yet: nothing to rejoin."
REJOIN_LEASE_RUNNING = (
    "This region still holds a processing lease until {until}: it may still be processing. "
    "Wait until it has run out, then run --rejoin again."
)
REJOIN_UNKNOWN_PROCESSOR = (
    "The processing region {region!r} (epoch {epoch}) is not a peer of this region."
)
REJOIN_NO_SUBSCRIPTION = (
    "This region has no subscription {name}: run region_setup (without --rejoin) first."
)
REJOIN_SYNC_TIMEOUT = (
    "The state tables were emptied and are being copied from {peer!r}, but {pending} were "
    "not copied within {seconds:.0f} s: watch pg_subscription_rel, run --rejoin again to check."
)
REJOIN_POLL_SECONDS = 0.2
REJOIN_WORKERS_EXIT_SECONDS = 60.0
# How many keys of one table and kind the listing prints; the counts are always whole.
TAIL_KEYS_SHOWN = 200


@dataclass
class TableTail:
    """One state table of the returning region against the processing region's."""

    table: str
    # Rows in this region's own id block the processing region lacks: written, never sent.
    never_sent: list[str] = field(default_factory=list)
    # Rows both hold with different contents: a change one side has not sent or applied yet.
    differ: list[str] = field(default_factory=list)
    # Rows outside this region's block the processing region lacks: deleted there and not yet
    # here, or written here outside processing.
    here_only: list[str] = field(default_factory=list)
    # Rows only the processing region holds (its work since the takeover): counted only.
    there_only: int = 0

    @property
    def empty(self) -> bool:
        return not (self.never_sent or self.differ or self.here_only or self.there_only)


def rejoin(*, sync_timeout: float = 300.0) -> tuple[SetupReport, list[TableTail]]:
    """List the tail, then replace this region's state tables with a fresh copy of the
    processing region's (the order of the repair: `_repair`)."""
    report = SetupReport()
    me = region_name()
    processor, epoch = _processing_peer(_remote_decisions())
    state = RegionState.objects.filter(name=me).first()
    if state is not None and state.lease_until and state.lease_until > timezone.now():
        raise RegionSetupError(REJOIN_LEASE_RUNNING.format(until=state.lease_until))
    report.say(f"processing region: {processor.name} (epoch {epoch})")
    with psycopg.connect(processor.url, connect_timeout=PEER_CONNECT_TIMEOUT_SECONDS) as remote:
        tails = region_tail(remote)
    for tail in tails:
        if not tail.empty:
            report.say(_tail_line(tail, processor))
    name = replication.subscription_name(me, processor.name)
    if replication.subscription(name) is None:
        raise RegionSetupError(REJOIN_NO_SUBSCRIPTION.format(name=name))
    if all(tail.empty for tail in tails) and _subscription_whole(name, processor):
        report.say(f"no tail, state tables as in {processor.name}: nothing to repair")
        return report, tails
    _repair(name, processor, sync_timeout, report)
    report.say(
        f"next: once this region has acknowledged epoch {epoch} (its inbox does, at its next "
        f"pass), run region_setup in {processor.name} so that it takes this region's state "
        "publications again"
    )
    return report, tails


def _remote_decisions() -> dict[str, tuple[int, str, str] | None]:
    decisions = {}
    for peer in peers():
        try:
            with psycopg.connect(peer.url, connect_timeout=PEER_CONNECT_TIMEOUT_SECONDS) as remote:
                decisions[peer.name] = remote.execute(
                    "SELECT epoch, decided_in, processing_region FROM regions_processingdecision "
                    "ORDER BY epoch DESC, decided_in DESC LIMIT 1"
                ).fetchone()
        except psycopg.OperationalError as exc:
            raise RegionSetupError(
                PEER_UNREACHABLE.format(peer=peer.name, error=type(exc).__name__)
            ) from exc
    return decisions


def _processing_peer(remote_decisions: dict[str, tuple[int, str, str] | None]) -> tuple[Peer, int]:
    """The processing region as the highest decision any of us can see names it; refuses
    when that is this region."""
    local = effective_decision()
    seen = [d for d in remote_decisions.values() if d is not None]
    if local is not None:
        seen.append((local.epoch, local.decided_in, local.processing_region))
    if not seen:
        raise RegionSetupError(REJOIN_NO_DECISION)
    epoch, _, processing = max(seen)
    if processing == region_name():
        raise RegionSetupError(REJOIN_IN_PROCESSING_REGION.format(epoch=epoch))
    peer = next((p for p in peers() if p.name == processing), None)
    if peer is None:
        raise RegionSetupError(REJOIN_UNKNOWN_PROCESSOR.format(region=processing, epoch=epoch))
    return peer, epoch


def region_tail(remote: psycopg.Connection) -> list[TableTail]:
    """This region's state tables compared with the processing region's, row by row: one pass
    over each table on both sides, primary keys and digests only."""
    start = id_block_start()
    end = start + (1 << ID_BLOCK_BITS)
    tails = []
    for table, pk in replication.state_primary_keys():
        with connection.cursor() as cursor:
            here = _row_digests(cursor, table, pk)
        there = _row_digests(remote.cursor(), table, pk)
        tail = TableTail(table)
        for key, digest in here.items():
            other = there.get(key)
            if other is None:
                own = key.isdigit() and start <= int(key) < end
                (tail.never_sent if own else tail.here_only).append(key)
            elif other != digest:
                tail.differ.append(key)
        tail.there_only = sum(1 for key in there if key not in here)
        tails.append(tail)
    return tails


def _row_digests(cursor: Any, table: str, pk: str) -> dict[str, str]:
    """Primary key (as text) -> md5 of the row's text form. Same TimeZone and schema on both
    sides, so equal rows give equal digests."""
    cursor.execute("SET TimeZone = 'UTC'")
    statement = sql.SQL("SELECT {pk}::text, md5(t::text) FROM {table} t").format(
        pk=sql.Identifier(pk), table=sql.Identifier(table)
    )
    cursor.execute(statement.as_string(None))
    return dict(cursor.fetchall())


def _tail_line(tail: TableTail, processor: Peer) -> str:
    parts = []
    if tail.never_sent:
        parts.append(f"{len(tail.never_sent)} never sent [{_shown(tail.never_sent)}]")
    if tail.differ:
        parts.append(f"{len(tail.differ)} differ [{_shown(tail.differ)}]")
    if tail.here_only:
        parts.append(f"{len(tail.here_only)} here only [{_shown(tail.here_only)}]")
    if tail.there_only:
        parts.append(f"{tail.there_only} only in {processor.name}")
    return f"tail {tail.table}: " + "; ".join(parts)


def _shown(keys: list[str]) -> str:
    ordered = sorted(keys, key=lambda key: (len(key), key))
    shown = ", ".join(ordered[:TAIL_KEYS_SHOWN])
    more = len(ordered) - TAIL_KEYS_SHOWN
    return shown + (f", … and {more} more" if more > 0 else "")


def _unsynchronised(name: str) -> list[str]:
    ready = replication.subscription_ready_tables(name)
    return [table for table in replication.state_tables() if table not in ready]


def _subscription_whole(name: str, processor: Peer) -> bool:
    """What a finished rejoin leaves (a run stopped half-way does not): enabled, taking all of
    the processing region's publications, every state table synchronised."""
    current = replication.subscription(name)
    wanted = sorted(replication.all_publications(processor.name))
    return (
        current is not None
        and current.enabled
        and sorted(current.publications) == wanted
        and not _unsynchronised(name)
    )


def _wait(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(REJOIN_POLL_SECONDS)
    return bool(condition())


def _repair(name: str, processor: Peer, sync_timeout: float, report: SetupReport) -> None:
    """Stop publishing state here; disable the subscription and wait for its workers to exit;
    point it at the peer's ingest and region publications only; empty the state tables
    (TRUNCATE is not published); enable and refresh, which drops the state tables from the
    subscription; point it at all the publications again with copy_data, which copies every
    state table anew. Raw events keep flowing throughout."""
    ingest_only = [
        replication.ingest_publication(processor.name),
        replication.region_publication(processor.name),
    ]
    # No state change of the processing region may be applied between the emptying and the
    # copy: the apply worker is gone before the subscription is re-pointed.
    replication.subscription_enable(name, False)
    if not _wait(lambda: replication.subscription_workers_gone(name), REJOIN_WORKERS_EXIT_SECONDS):
        raise RegionSetupError(f"the workers of {name} did not exit; nothing was emptied")
    replication.subscription_set_publications(name, ingest_only, refresh=False)
    report.say(f"subscription {name} disabled, taking only raw events and region rows")
    with transaction.atomic(), connection.cursor() as cursor:
        # Its acknowledgement of the decision empties them too; this covers a region that has
        # not acknowledged yet.
        if replication.publish_state(False):
            report.say("this region's state publications emptied")
        tables = sql.SQL(", ").join(sql.Identifier(t) for t in replication.state_tables())
        cursor.execute(sql.SQL("TRUNCATE {}").format(tables).as_string(None))
    report.say(f"state tables emptied: {', '.join(replication.state_tables())}")
    replication.subscription_enable(name, True)
    # A refresh copies only tables new to the subscription: drop the state tables first.
    replication.subscription_refresh(name)
    replication.subscription_set_publications(
        name, replication.all_publications(processor.name), refresh=True, copy_data=True
    )
    report.say(f"subscription {name} enabled, copying the state tables from {processor.name}")
    if not _wait(lambda: not _unsynchronised(name), sync_timeout):
        raise RegionSetupError(
            REJOIN_SYNC_TIMEOUT.format(
                peer=processor.name, pending=", ".join(_unsynchronised(name)), seconds=sync_timeout
            )
        )
    with connection.cursor() as cursor:
        counts = []
        for table in replication.state_tables():
            statement = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
            cursor.execute(statement.as_string(None))
            counts.append(f"{table} {cursor.fetchone()[0]}")
    report.say(f"state tables copied from {processor.name}: {', '.join(counts)}")
