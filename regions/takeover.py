"""The takeover's one privileged step, for a console that does not own the subscription
(docs/multi-region.md, "Database roles").

A takeover re-points this region's subscription from the lost peer away from its state
publications (`ALTER SUBSCRIPTION … SET PUBLICATION … WITH (refresh = false)`), in the
transaction that records the decision. PostgreSQL lets only the subscription's owner alter
it, and in PostgreSQL 15 that owner is the superuser (or managed admin) that ran
region_setup, never the console's role, which serves the operator's API. So the step is a
SECURITY DEFINER function owned by that role: `eventdrop_region_subscription_without_state
(peer)`, which does exactly this one thing for a peer name, to this region's subscription
from it, with the subscription and publication names built inside it from constants and
the peer's validated name. `manage.py db_roles` grants EXECUTE on it to the console role
only.

region_setup runs `subscription_without_state_function(region)` with its other statements
(as the subscription's owner). Where the function does not exist (a region set up before it,
or the owner itself running the takeover from a shell), the statement is run directly, as
before: it then needs the owner.
"""

from django.db import connection

from regions import publications
from regions.publications import (
    catalog_publication,
    ingest_publication,
    region_publication,
    subscription_name,
)

FUNCTION = "eventdrop_region_subscription_without_state"
SIGNATURE = f"{FUNCTION}(text)"


def _literal(value: str) -> str:
    # Region names match regions.configuration.NAME (letters, digits, underscore).
    return "'" + value.replace("'", "''") + "'"


def subscription_without_state_function(region: str) -> str:
    """CREATE OR REPLACE the function for this region (idempotent; keeps its grants).

    The peer's name is checked against the region-name pattern before it is used, and every
    name reaches the statement through format('%I'), so a caller can re-point nothing but
    this region's subscription from a peer, and only to that peer's state-free publications.
    """
    me = _literal(region)
    prefix = _literal(subscription_name(region, ""))
    ingest, own, catalog = (
        _literal(ingest_publication("")),
        _literal(region_publication("")),
        _literal(catalog_publication("")),
    )
    return f"""
CREATE OR REPLACE FUNCTION {FUNCTION}(peer text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_catalog AS $fn$
DECLARE
  sub text;
BEGIN
  IF peer !~ '^[a-z][a-z0-9_]{{0,30}}$' OR peer = {me} THEN
    RAISE EXCEPTION 'not a peer region name: %', peer;
  END IF;
  sub := {prefix} || peer;
  IF NOT EXISTS (SELECT 1 FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid
                 WHERE d.datname = current_database() AND s.subname = sub) THEN
    RETURN false;
  END IF;
  EXECUTE format('ALTER SUBSCRIPTION %I SET PUBLICATION %I, %I, %I WITH (refresh = false)',
                 sub, {ingest} || peer, {own} || peer, {catalog} || peer);
  RETURN true;
END
$fn$"""  # noqa: S608


def subscription_without_state(region: str, peer: str) -> bool:
    """At a takeover: stop taking the lost peer's state (regions.publications documents the
    statement). Through the function when region_setup created it, else directly. False
    when this region has no subscription from the peer."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regprocedure(%s) IS NOT NULL", [SIGNATURE])
        if cursor.fetchone()[0]:
            cursor.execute(f"SELECT {FUNCTION}(%s)", [peer])
            return bool(cursor.fetchone()[0])
    return publications.subscription_without_state(region, peer)
