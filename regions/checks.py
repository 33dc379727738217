"""The region checks (docs/multi-region.md, "Configuration"): a region needs a name and a
number, a peer is another database, and every region verifies webhooks with the same secrets
(compared by fingerprint, with the database checks: the peer's row is read as replicated).
"""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.db import DatabaseError

from regions.configuration import (
    NAME,
    NUMBER_RANGE,
    database_address,
    multi_region,
    own_database_address,
    peers,
)
from regions.fingerprints import secret_fingerprints

NO_NAME = "EVENTDROP_REGION_PEERS is set but EVENTDROP_REGION is empty: a region needs a name."
BAD_NAME = "EVENTDROP_REGION {name!r} is not a region name (lower-case letter, then a-z, 0-9, _)."
BAD_NUMBER = (
    "EVENTDROP_REGION_NUMBER {number} is outside 1-127: every region needs its own id block."
)
BAD_PEER = "EVENTDROP_REGION_PEERS part {part!r} is not `name=postgres://…` with a region name."
PEER_IS_SELF = "EVENTDROP_REGION_PEERS names {peer!r}, which is this region's own {what}."
SECRETS_DIFFER = (
    "Region {peer!r} verifies source {source!r} with other secrets than this region "
    "(compared by sha256 fingerprint): events received there would be rejected here."
)
SAME_NUMBER = "Region {peer!r} has EVENTDROP_REGION_NUMBER {number} too: their ids would collide."
SESSION_LOCK_POOLED = (
    "This {kind} process connects through PgBouncer in transaction pooling mode "
    "(DATABASE_POOLER=pgbouncer) with several regions: the processing pass's session advisory "
    "lock (regions/services.py) would be held by, and released on, whichever server session "
    "PgBouncer lends, so a switch of the processing region could be acknowledged under a "
    "running pass."
)
SESSION_LOCK_POOLED_HINT = (
    "Connect the inbox, dispatcher and worker directly or through session pooling: unset "
    'DATABASE_POOLER in their environment (docs/multi-region.md, "Database roles").'
)
# The kinds whose processes run processing passes (kernel/process_kinds.py).
PASSING_KINDS = {"inbox", "dispatcher", "worker"}


@checks.register()
def check_region_configuration(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    if not multi_region():
        if settings.EVENTDROP_REGION and not NAME.match(settings.EVENTDROP_REGION):
            name = settings.EVENTDROP_REGION
            return [checks.Error(BAD_NAME.format(name=name), id="regions.E002")]
        return []
    name = settings.EVENTDROP_REGION
    if not name:
        return [checks.Error(NO_NAME, hint="Set EVENTDROP_REGION, e.g. eu.", id="regions.E001")]
    errors: list[checks.CheckMessage] = []
    if not NAME.match(name):
        errors.append(checks.Error(BAD_NAME.format(name=name), id="regions.E002"))
    if settings.EVENTDROP_REGION_NUMBER not in NUMBER_RANGE:
        number = settings.EVENTDROP_REGION_NUMBER
        errors.append(checks.Error(BAD_NUMBER.format(number=number), id="regions.E003"))
    parsed = peers()
    for part in settings.EVENTDROP_REGION_PEERS.split(";"):
        peer_name, sep, url = part.strip().partition("=")
        if not (sep and NAME.match(peer_name.strip()) and url.strip().startswith("postgres")):
            errors.append(checks.Error(BAD_PEER.format(part=part.strip()), id="regions.E004"))
    own = own_database_address()
    for peer in parsed:
        if peer.name == name:
            errors.append(
                checks.Error(PEER_IS_SELF.format(peer=peer.name, what="name"), id="regions.E005")
            )
        elif peer.url and database_address(peer.url) == own:
            message = PEER_IS_SELF.format(peer=peer.name, what="database")
            errors.append(checks.Error(message, id="regions.E005"))
    return errors


@checks.register(checks.Tags.database)
def check_peer_agreement(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    if not (multi_region() and settings.EVENTDROP_REGION):
        return []
    from regions.models import RegionState

    try:
        rows = list(RegionState.objects.exclude(name=settings.EVENTDROP_REGION))
    except DatabaseError:
        return []  # not migrated yet: migrate runs next, and region_setup checks again
    ours = secret_fingerprints()
    errors: list[checks.CheckMessage] = []
    for row in rows:
        if row.number == settings.EVENTDROP_REGION_NUMBER:
            message = SAME_NUMBER.format(peer=row.name, number=row.number)
            errors.append(checks.Error(message, id="regions.E007"))
        for source in sorted(set(ours) | set(row.secret_fingerprints)):
            if ours.get(source, []) != row.secret_fingerprints.get(source, []):
                errors.append(
                    checks.Error(
                        SECRETS_DIFFER.format(peer=row.name, source=source),
                        hint="Rotate the secret in both regions (both values during rotation).",
                        id="regions.E006",
                    )
                )
    return errors


@checks.register()
def check_pass_lock_session(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """regions.E008/W008: a pass holds a session advisory lock across its transactions, which
    PgBouncer's transaction pooling cannot keep. An error for a process of a kind that runs
    passes; a warning when no kind is set (the same settings may start one)."""
    if not multi_region():
        return []
    if settings.DATABASES["default"].get("OPTIONS", {}).get("pooler") != "pgbouncer":
        return []
    kind = settings.PROCESS_KIND
    if kind in PASSING_KINDS:
        message = SESSION_LOCK_POOLED.format(kind=kind)
        return [checks.Error(message, hint=SESSION_LOCK_POOLED_HINT, id="regions.E008")]
    if not kind:
        message = SESSION_LOCK_POOLED.format(kind="(EVENTDROP_PROCESS unset)")
        return [checks.Warning(message, hint=SESSION_LOCK_POOLED_HINT, id="regions.W008")]
    return []
