"""This region's name, number and peers, read from settings once (docs/multi-region.md).

One region (EVENTDROP_REGION empty) is the default and needs none of this: every question
here then answers "this region processes", and nothing is published or subscribed.
"""

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

NAME = re.compile(r"^[a-z][a-z0-9_]{0,30}$")
NUMBER_RANGE = range(1, 128)
# Ids a region hands out start at number << ID_BLOCK_BITS: 2.8e14 ids per region, and 127
# regions still fit a bigint.
ID_BLOCK_BITS = 48


@dataclass(frozen=True)
class Peer:
    name: str
    url: str = ""


def region_name() -> str:
    return settings.EVENTDROP_REGION


def multi_region() -> bool:
    return bool(settings.EVENTDROP_REGION_PEERS.strip())


def peers() -> list[Peer]:
    """EVENTDROP_REGION_PEERS parsed: `name=url;name=url`. Malformed parts are reported by
    the checks (regions.E00x), skipped here."""
    found = []
    for part in settings.EVENTDROP_REGION_PEERS.split(";"):
        name, sep, url = part.strip().partition("=")
        if sep and name.strip():
            found.append(Peer(name=name.strip(), url=url.strip()))
    return found


def id_block_start(number: int | None = None) -> int:
    return (number if number is not None else settings.EVENTDROP_REGION_NUMBER) << ID_BLOCK_BITS


def database_address(url: str) -> tuple[str, int, str]:
    """(host, port, database) of a postgres:// URL, for telling one database from another."""
    parts = urlsplit(url)
    return (parts.hostname or "localhost", parts.port or 5432, parts.path.lstrip("/"))


def own_database_address() -> tuple[str, int, str]:
    db = settings.DATABASES["default"]
    return (db.get("HOST") or "localhost", int(db.get("PORT") or 5432), db["NAME"])
