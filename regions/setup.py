"""region_setup: make this region's database ready to replicate with its peers, idempotently
(docs/multi-region.md, "Configuration"). Every step reads what exists first and does only
what is missing, so running it again — after a deploy, after a takeover, in either order in
the two regions — converges.
"""

from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from psycopg import sql

from ingress.models import RawEvent
from regions import publications
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
    _claim_unlabelled_rows(me, report)
    _id_blocks(report)
    region_state_write(number=settings.EVENTDROP_REGION_NUMBER)
    report.say(f"region row {me!r} written (number {settings.EVENTDROP_REGION_NUMBER})")
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in publications.publication_statements(me):
            cursor.execute(statement)
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
            # copy_data: the peer's region row and decisions, written before this
            # subscription's slot existed, must arrive too. The raw and state tables are
            # copied as well, which is right for a new pair (the peer holds only its own
            # rows) and is why a region joining one with a history needs the base copy of
            # docs/multi-region.md instead.
            statement = sql.SQL(
                "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (copy_data = true)"
            ).format(sql.Identifier(name), sql.Literal(peer.url), pubs)
            cursor.execute(statement.as_string(cursor.connection))
            report.say(f"subscription {name} created ({', '.join(wanted)})")
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
