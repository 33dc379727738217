"""region_setup: make this region's database ready to replicate with its peers. Each step reads
what exists and does only what is missing, so a run again, in either region, converges
(docs/multi-region.md, "Configuration").
"""

from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from psycopg import sql

from ingress.models import RawEvent
from regions import replication
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
        for statement in replication.setup_statements(me):
            cursor.execute(statement)
    report.say(f"publications {', '.join(replication.all_publications(me))} in place")
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
    """Raw events stored before this database had a region are this region's."""
    updated = RawEvent.objects.filter(region="").update(region=me)
    if updated:
        report.say(f"{updated} raw events stored before regions labelled {me!r}")


def _id_blocks(report: SetupReport) -> None:
    start = id_block_start()
    end = start + (1 << ID_BLOCK_BITS)
    with connection.cursor() as cursor:
        for table in replication.id_tables():
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
    name = replication.subscription_name(region_name(), peer.name)
    wanted = _wanted_publications(peer)
    try:
        with psycopg.connect(peer.url, connect_timeout=PEER_CONNECT_TIMEOUT_SECONDS) as remote:
            if _identity(remote.cursor()) == own_identity:
                raise RegionSetupError(PEER_IS_THIS_DATABASE.format(peer=peer.name))
            have = {row[0] for row in remote.execute("SELECT pubname FROM pg_publication")}
    except psycopg.OperationalError as exc:
        report.failed.append(PEER_UNREACHABLE.format(peer=peer.name, error=type(exc).__name__))
        return
    missing = [pub for pub in replication.all_publications(peer.name) if pub not in have]
    if missing:
        report.failed.append(PEER_NOT_READY.format(peer=peer.name, publication=missing[0]))
        return
    current = replication.subscription(name)
    if current is None:
        _create_subscription(peer, name, wanted, report)
        return
    if sorted(current.publications) != sorted(wanted):
        replication.subscription_set_publications(name, wanted, refresh=True)
        report.say(f"subscription {name} now takes {', '.join(wanted)}")
    else:
        report.say(f"subscription {name} in place ({', '.join(wanted)})")
    if not current.enabled:
        replication.subscription_enable(name, True)
        report.say(f"subscription {name} enabled")
    # A table a release added to the peer's publications is taken from now on.
    replication.subscription_refresh(name)


def _create_subscription(peer: Peer, name: str, wanted: list[str], report: SetupReport) -> None:
    """A region with state of its own (one with history, subscribing to the newcomer that copied
    it) copies only the peer's raw events, decisions and region row: a copy of the state
    tables would land on its own rows. The state publications are added without a copy."""
    with_copy = wanted
    if _holds_state():
        copied = {
            replication.ingest_publication(peer.name),
            replication.region_publication(peer.name),
        }
        with_copy = [pub for pub in wanted if pub in copied]
    replication.subscription_create(name, peer.url, with_copy)
    if with_copy != wanted:
        replication.subscription_set_publications(name, wanted, refresh=True)
        report.say(f"subscription {name}: this region holds state, so only the peer's raw "
                   "events, decisions and region row were copied")
    report.say(f"subscription {name} created ({', '.join(wanted)})")


def _holds_state() -> bool:
    with connection.cursor() as cursor:
        for table in replication.state_tables():
            statement = sql.SQL("SELECT EXISTS (SELECT FROM {})").format(sql.Identifier(table))
            cursor.execute(statement.as_string(None))
            if cursor.fetchone()[0]:
                return True
    return False


def _wanted_publications(peer: Peer) -> list[str]:
    """After this region took over from the peer and before the peer acknowledged, its unsent
    tail of processing state is not taken (it would land on this region's later work)."""
    decision = effective_decision()
    if decision is not None and decision.peer_lost and decision.decided_in == region_name():
        state = RegionState.objects.filter(name=peer.name).first()
        if state is None or state.seen_epoch < decision.epoch:
            return replication.state_free_publications(peer.name)
    return replication.all_publications(peer.name)
