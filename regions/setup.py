"""region_setup: make this region's database ready to replicate with its peers, idempotently
(docs/multi-region.md, "Configuration"). Every step reads what exists first and does only
what is missing, so running it again — after a deploy, after a takeover, in either order in
the two regions — converges.
"""

import functools
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from psycopg import sql

from ingress.models import RawEvent
from regions import publications, takeover
from regions.configuration import ID_BLOCK_BITS, Peer, id_block_start, peers, region_name
from regions.models import ProcessingDecision, RegionState
from regions.selectors import effective_decision
from regions.services import region_state_write

PEER_CONNECT_TIMEOUT_SECONDS = 5
PEER_IS_THIS_DATABASE = "Peer {peer!r} is this very database (same system and database name)."
PEER_NOT_READY = (
    "Peer {peer!r} has no publication {publication} yet: run region_setup there, then here again."
)
PEER_UNREACHABLE = "Peer {peer!r} cannot be reached ({error}); its subscription is left as it is."
WAL_LEVEL_NOT_LOGICAL = (
    "This database's server runs with wal_level = {level}: logical replication needs "
    "wal_level = logical in postgresql.conf and a restart (docs/multi-region.md, \"Setting a "
    "region up, step by step\")."
)


class RegionSetupError(Exception):
    pass


@dataclass
class SetupReport:
    lines: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.lines.append(line)


def region_setup(*, processing_region: str = "") -> SetupReport:
    report = SetupReport()
    me = region_name()
    with connection.cursor() as cursor:
        cursor.execute("SHOW wal_level")
        level = cursor.fetchone()[0]
    if level != "logical":
        raise RegionSetupError(WAL_LEVEL_NOT_LOGICAL.format(level=level))
    _claim_unlabelled_rows(me, report)
    _id_blocks(report)
    region_state_write(number=settings.EVENTDROP_REGION_NUMBER)
    report.say(f"region row {me!r} written (number {settings.EVENTDROP_REGION_NUMBER})")
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in publications.publication_statements(me):
            cursor.execute(statement)
        cursor.execute(takeover.subscription_without_state_function(me))
        # PostgreSQL lets every role run a new function, SECURITY DEFINER ones included:
        # nobody may until `manage.py db_roles` grants each to its roles.
        for signature in (publications.PUBLISH_STATE_SIGNATURE, takeover.SIGNATURE):
            cursor.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    report.say(f"publications {', '.join(publications.all_publications(me))} in place")
    if processing_region and effective_decision() is None:
        ProcessingDecision.objects.create(
            epoch=1,
            decided_in=me,
            processing_region=processing_region,
            actor_username="region_setup",
            reason="first processing region",
        )
        report.say(f"first processing decision: {processing_region}")
    own_identity = _identity(connection.cursor())
    for peer in peers():
        _subscribe(peer, own_identity, report)
    return report


def _claim_unlabelled_rows(me: str, report: SetupReport) -> None:
    """Raw events stored before this database had a region (one region becoming the first of
    several) are this region's. One UPDATE: run once, at the switch to regions."""
    updated = RawEvent.objects.filter(region="").update(region=me)
    if updated:
        report.say(f"{updated} raw events stored before regions labelled {me!r}")


def _id_blocks(report: SetupReport) -> None:
    start = id_block_start()
    end = start + (1 << ID_BLOCK_BITS)
    with connection.cursor() as cursor:
        for table in publications.id_tables():
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
            sequence = cursor.fetchone()[0]
            if sequence is None:
                continue
            cursor.execute(f"SELECT last_value, is_called FROM {sequence}")  # noqa: S608 (catalog name)
            last_value, _ = cursor.fetchone()
            if not start <= last_value < end:
                cursor.execute("SELECT setval(%s, %s, false)", [sequence, start])
                report.say(f"{table}: ids from {start} on")


def _identity(cursor: Any) -> tuple[str, str]:
    cursor.execute("SELECT system_identifier::text, current_database() FROM pg_control_system()")
    system, database = cursor.fetchone()
    return system, database


def _subscribe(peer: Peer, own_identity: tuple[str, str], report: SetupReport) -> None:
    me = region_name()
    name = publications.subscription_name(me, peer.name)
    wanted = _wanted_publications(peer)
    try:
        with psycopg.connect(peer.url, connect_timeout=PEER_CONNECT_TIMEOUT_SECONDS) as remote:
            if _identity(remote.cursor()) == own_identity:
                raise RegionSetupError(PEER_IS_THIS_DATABASE.format(peer=peer.name))
            have = {row[0] for row in remote.execute("SELECT pubname FROM pg_publication")}
    except psycopg.OperationalError as exc:
        report.failed.append(PEER_UNREACHABLE.format(peer=peer.name, error=type(exc).__name__))
        return
    missing = [pub for pub in publications.all_publications(peer.name) if pub not in have]
    if missing:
        report.failed.append(PEER_NOT_READY.format(peer=peer.name, publication=missing[0]))
        return
    pubs = sql.SQL(", ").join(sql.Identifier(pub) for pub in wanted)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT subpublications, subenabled FROM pg_subscription s JOIN pg_database d "
            "ON d.oid = s.subdbid WHERE d.datname = current_database() AND s.subname = %s",
            [name],
        )
        row = cursor.fetchone()
        # CREATE/ALTER SUBSCRIPTION … refresh cannot run in a transaction block: Django's
        # connection is in autocommit here (no atomic around this function).
        if row is None:
            _create_subscription(cursor, peer, name, wanted, report)
            return
        current, enabled = row
        if sorted(current) != sorted(wanted):
            statement = sql.SQL(
                "ALTER SUBSCRIPTION {} SET PUBLICATION {} WITH (refresh = true, copy_data = false)"
            ).format(sql.Identifier(name), pubs)
            cursor.execute(statement.as_string(cursor.connection))
            report.say(f"subscription {name} now takes {', '.join(wanted)}")
        else:
            report.say(f"subscription {name} in place ({', '.join(wanted)})")
        if not enabled:
            cursor.execute(
                sql.SQL("ALTER SUBSCRIPTION {} ENABLE")
                .format(sql.Identifier(name))
                .as_string(cursor.connection)
            )
            report.say(f"subscription {name} enabled")
        # A table a release added to the peer's publications is taken from now on (its rows
        # from before are not copied: both regions migrated it, and a copy could collide).
        cursor.execute(
            sql.SQL("ALTER SUBSCRIPTION {} REFRESH PUBLICATION WITH (copy_data = false)")
            .format(sql.Identifier(name))
            .as_string(cursor.connection)
        )


def _create_subscription(
    cursor: Any, peer: Peer, name: str, wanted: list[str], report: SetupReport
) -> None:
    """CREATE SUBSCRIPTION with copy_data: the peer's rows from before the subscription's slot
    existed arrive too — its region row and decisions, and for a region that joins one with
    history, the base copy of its raw events and state. A region that itself holds state
    (the one with history, subscribing to the newcomer that copied it) must not copy the
    state tables back over its own rows: it copies the peer's raw events, decisions and
    region row only, then adds the state publications without a copy."""
    with_copy = wanted
    if _holds_state():
        copied = {
            publications.ingest_publication(peer.name),
            publications.region_publication(peer.name),
        }
        with_copy = [pub for pub in wanted if pub in copied]
    statement = sql.SQL(
        "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (copy_data = true)"
    ).format(
        sql.Identifier(name),
        sql.Literal(peer.url),
        sql.SQL(", ").join(sql.Identifier(pub) for pub in with_copy),
    )
    cursor.execute(statement.as_string(cursor.connection))
    if with_copy != wanted:
        statement = sql.SQL(
            "ALTER SUBSCRIPTION {} SET PUBLICATION {} WITH (refresh = true, copy_data = false)"
        ).format(sql.Identifier(name), sql.SQL(", ").join(sql.Identifier(p) for p in wanted))
        cursor.execute(statement.as_string(cursor.connection))
        report.say(f"subscription {name}: this region holds state, so only the peer's raw "
                   "events, decisions and region row were copied")
    report.say(f"subscription {name} created ({', '.join(wanted)})")


def _holds_state() -> bool:
    """Whether this region's state tables hold rows (it has a history of its own)."""
    with connection.cursor() as cursor:
        for table in publications.state_tables():
            cursor.execute(
                sql.SQL("SELECT EXISTS (SELECT FROM {})")
                .format(sql.Identifier(table))
                .as_string(cursor.connection)
            )
            if cursor.fetchone()[0]:
                return True
    return False


def _wanted_publications(peer: Peer) -> list[str]:
    """All four of the peer's publications, except after this region took over from it and
    before it acknowledged: its unsent tail of processing state is then not taken (it would
    land on this region's later work), only its raw events and its region row."""
    decision = effective_decision()
    if decision is not None and decision.peer_lost and decision.decided_in == region_name():
        state = RegionState.objects.filter(name=peer.name).first()
        if state is None or state.seen_epoch < decision.epoch:
            return publications.without_state(peer.name)
    return publications.all_publications(peer.name)


# --- rejoin (docs/multi-region.md, "Rejoin") -------------------------------------------------

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
# DISABLE returns at once; the apply worker notices it between transactions.
REJOIN_WORKERS_EXIT_SECONDS = 60.0
# How many keys of one table and kind the listing prints; the counts are always whole.
TAIL_KEYS_SHOWN = 200


@dataclass
class TableTail:
    """One state table of the returning region against the processing region's."""

    table: str
    # Rows with ids in this region's own block that the processing region lacks: state this
    # region wrote and never sent (the at-least-once window).
    never_sent: list[str] = field(default_factory=list)
    # Rows both hold, with different contents: a change this region made and never sent, or
    # one the processing region made that has not been applied here yet.
    differ: list[str] = field(default_factory=list)
    # Rows outside this region's block (or without a numeric id) the processing region lacks:
    # deleted there and not yet here, or written here outside processing.
    here_only: list[str] = field(default_factory=list)
    # Rows only the processing region holds (its work since the takeover): counted only.
    there_only: int = 0

    @property
    def empty(self) -> bool:
        return not (self.never_sent or self.differ or self.here_only or self.there_only)


def _row_digests(cursor: Any, table: str, pk: str) -> dict[str, str]:
    """Primary key (as text) -> md5 of the row's text form, for one state table. Both sides
    read with the same TimeZone and the same schema (same migrations), so equal rows give
    equal digests."""
    cursor.execute("SET TimeZone = 'UTC'")
    statement = sql.SQL("SELECT {pk}::text, md5(t::text) FROM {table} t").format(
        pk=sql.Identifier(pk), table=sql.Identifier(table)
    )
    cursor.execute(statement.as_string(cursor.connection))
    return dict(cursor.fetchall())


def _shown(keys: list[str]) -> str:
    ordered = sorted(keys, key=lambda key: (len(key), key))
    shown = ", ".join(ordered[:TAIL_KEYS_SHOWN])
    more = len(ordered) - TAIL_KEYS_SHOWN
    return shown + (f", … and {more} more" if more > 0 else "")


def region_tail(remote: psycopg.Connection) -> list[TableTail]:
    """The returning region's state tables compared with the processing region's, row by row
    (one pass over each state table on both sides: primary keys and digests, no payloads)."""
    start = id_block_start()
    end = start + (1 << ID_BLOCK_BITS)
    tails = []
    for table, pk in publications.state_primary_keys():
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


def rejoin(*, sync_timeout: float = 300.0) -> tuple[SetupReport, list[TableTail]]:
    """List the tail this region wrote and the processing region never received, then
    replace this region's state tables with a fresh copy of the processing region's.

    Order (PostgreSQL 15, public features only): stop publishing state here; disable the
    subscription from the processing region and wait for its workers to exit; point it at
    the peer's ingest and region publications only; empty the state tables (TRUNCATE is not
    published: the publications publish insert, update and delete only); enable it and
    refresh, which drops the state tables from the subscription; point it at all five
    publications again with copy_data, which copies every state table anew, and wait until
    each is synchronised. Raw events keep flowing throughout: the ingest publication stays."""
    report = SetupReport()
    me = region_name()
    remote_decisions = {}
    for peer in peers():
        try:
            with psycopg.connect(peer.url, connect_timeout=PEER_CONNECT_TIMEOUT_SECONDS) as remote:
                remote_decisions[peer.name] = remote.execute(
                    "SELECT epoch, decided_in, processing_region FROM regions_processingdecision "
                    "ORDER BY epoch DESC, decided_in DESC LIMIT 1"
                ).fetchone()
        except psycopg.OperationalError as exc:
            raise RegionSetupError(
                PEER_UNREACHABLE.format(peer=peer.name, error=type(exc).__name__)
            ) from exc
    processor, epoch = _processing_peer(remote_decisions)
    state = RegionState.objects.filter(name=me).first()
    if state is not None and state.lease_until and state.lease_until > timezone.now():
        raise RegionSetupError(REJOIN_LEASE_RUNNING.format(until=state.lease_until))
    report.say(f"processing region: {processor.name} (epoch {epoch})")
    with psycopg.connect(processor.url, connect_timeout=PEER_CONNECT_TIMEOUT_SECONDS) as remote:
        tails = region_tail(remote)
    for tail in tails:
        if tail.empty:
            continue
        parts = []
        if tail.never_sent:
            parts.append(f"{len(tail.never_sent)} never sent [{_shown(tail.never_sent)}]")
        if tail.differ:
            parts.append(f"{len(tail.differ)} differ [{_shown(tail.differ)}]")
        if tail.here_only:
            parts.append(f"{len(tail.here_only)} here only [{_shown(tail.here_only)}]")
        if tail.there_only:
            parts.append(f"{tail.there_only} only in {processor.name}")
        report.say(f"tail {tail.table}: " + "; ".join(parts))
    name = publications.subscription_name(me, processor.name)
    if not _subscription_exists(name):
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


def _subscription_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid "
            "WHERE d.datname = current_database() AND s.subname = %s",
            [name],
        )
        return cursor.fetchone() is not None


def _state_synchronised(name: str) -> bool:
    """Every state table listed by the subscription and synchronised ('r')."""
    return not _unsynchronised(name)


def _subscription_whole(name: str, processor: Peer) -> bool:
    """Enabled, taking all of the processing region's publications, every state table
    synchronised: what a finished rejoin leaves (a run stopped half-way does not)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT subenabled, subpublications FROM pg_subscription s "
            "JOIN pg_database d ON d.oid = s.subdbid "
            "WHERE d.datname = current_database() AND s.subname = %s",
            [name],
        )
        row = cursor.fetchone()
    wanted = sorted(publications.all_publications(processor.name))
    return row is not None and row[0] and sorted(row[1]) == wanted and _state_synchronised(name)


def _unsynchronised(name: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_subscription_rel r "
            "JOIN pg_subscription s ON s.oid = r.srsubid "
            "JOIN pg_class c ON c.oid = r.srrelid "
            "WHERE s.subname = %s AND r.srsubstate = 'r'",
            [name],
        )
        ready = {row[0] for row in cursor.fetchall()}
    return [table for table in publications.state_tables() if table not in ready]


def _alter(name: str, clause: sql.Composable) -> None:
    with connection.cursor() as cursor:
        statement = sql.SQL("ALTER SUBSCRIPTION {} ").format(sql.Identifier(name)) + clause
        cursor.execute(statement.as_string(cursor.connection))


def _wait(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(REJOIN_POLL_SECONDS)
    return bool(condition())


def _workers_gone(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_subscription WHERE subname = %s AND pid IS NOT NULL",
            [name],
        )
        return cursor.fetchone()[0] == 0


def _repair(name: str, processor: Peer, sync_timeout: float, report: SetupReport) -> None:
    ingest_only = sql.SQL(", ").join(
        sql.Identifier(pub)
        for pub in (
            publications.ingest_publication(processor.name),
            publications.region_publication(processor.name),
        )
    )
    every = sql.SQL(", ").join(
        sql.Identifier(pub) for pub in publications.all_publications(processor.name)
    )
    # No state change of the processing region may be applied between the emptying and the
    # copy: the subscription is disabled (its apply worker gone) before it is re-pointed.
    _alter(name, sql.SQL("DISABLE"))
    if not _wait(functools.partial(_workers_gone, name), REJOIN_WORKERS_EXIT_SECONDS):
        raise RegionSetupError(f"the workers of {name} did not exit; nothing was emptied")
    _alter(name, sql.SQL("SET PUBLICATION {} WITH (refresh = false)").format(ingest_only))
    report.say(f"subscription {name} disabled, taking only raw events and region rows")
    with transaction.atomic(), connection.cursor() as cursor:
        # This region does not process: its state publications must be empty anyway (its
        # acknowledgement of the decision empties them); emptied here too, in case it has
        # not acknowledged yet.
        if publications.publish_state(False):
            report.say("this region's state publications emptied")
        tables = sql.SQL(", ").join(sql.Identifier(t) for t in publications.state_tables())
        cursor.execute(sql.SQL("TRUNCATE {}").format(tables).as_string(cursor.connection))
    report.say(f"state tables emptied: {', '.join(publications.state_tables())}")
    _alter(name, sql.SQL("ENABLE"))
    # A refresh against the ingest and region publications only drops the state tables from
    # the subscription, so that adding them back below copies them (a refresh copies only
    # tables new to the subscription). A refresh needs an enabled subscription.
    _alter(name, sql.SQL("REFRESH PUBLICATION WITH (copy_data = false)"))
    _alter(
        name, sql.SQL("SET PUBLICATION {} WITH (refresh = true, copy_data = true)").format(every)
    )
    report.say(f"subscription {name} enabled, copying the state tables from {processor.name}")
    if not _wait(lambda: _state_synchronised(name), sync_timeout):
        raise RegionSetupError(
            REJOIN_SYNC_TIMEOUT.format(
                peer=processor.name, pending=", ".join(_unsynchronised(name)), seconds=sync_timeout
            )
        )
    with connection.cursor() as cursor:
        counts = []
        for table in publications.state_tables():
            cursor.execute(
                sql.SQL("SELECT count(*) FROM {}")
                .format(sql.Identifier(table))
                .as_string(cursor.connection)
            )
            counts.append(f"{table} {cursor.fetchone()[0]}")
    report.say(f"state tables copied from {processor.name}: {', '.join(counts)}")
