"""Every replication statement of the regions: the publications, the subscriptions and the two
SECURITY DEFINER functions, with the names they use (docs/multi-region.md, "What crosses, on
which publication"). Names come from validated region names (regions.configuration.NAME) and
model metadata, quoted by psycopg.sql; no other input reaches the SQL text.
"""

from dataclasses import dataclass

from django.apps import apps
from django.db import connection, models
from psycopg import sql

from ingress.models import RawEvent, RawEventOrigin
from kernel.db import sql_literal
from regions.models import ProcessingDecision, RegionState

# Tables only the processing region writes: published whole, from there. Every other table is
# local to its region (users, sessions, API tokens, django-q2, the console's audit and jobs).
STATE_MODELS = (
    "ingress.DedupKey",
    "ingress.Delivery",
    "ingress.DeliveryAttempt",
    "ingress.HandlerPause",
    "ingress.RejectedPayloadMinute",
    "ingress.ReconciliationRun",
    "ingress.SignatureQuestion",
    "recaps.Event",
    "recaps.Photo",
    "recaps.RecapVideo",
    "outbox.RecapSideEffect",
    "outbox.RecapSideEffectAttempt",
    "outbox.CircuitBreaker",
)

PUBLISH_STATE_FUNCTION = "eventdrop_region_publish_state"
PUBLISH_STATE_SIGNATURE = f"{PUBLISH_STATE_FUNCTION}(boolean)"
WITHOUT_STATE_FUNCTION = "eventdrop_region_subscription_without_state"
WITHOUT_STATE_SIGNATURE = f"{WITHOUT_STATE_FUNCTION}(text)"


def state_tables() -> list[str]:
    return [apps.get_model(label)._meta.db_table for label in STATE_MODELS]


def state_primary_keys() -> list[tuple[str, str]]:
    """(table, primary key column) of every state table (each has a one-column key)."""
    return [
        (model._meta.db_table, model._meta.pk.column)
        for model in (apps.get_model(label) for label in STATE_MODELS)
    ]


def id_tables() -> list[str]:
    """Tables whose rows cross regions with an auto `id`: each region's sequence hands out ids
    in its own block."""
    crossing: list[type[models.Model]] = [
        RawEvent,
        ProcessingDecision,
        *(apps.get_model(label) for label in STATE_MODELS),
    ]
    return [
        model._meta.db_table
        for model in crossing
        if isinstance(model._meta.pk, models.AutoField | models.BigAutoField)
        and model._meta.pk.column == "id"
    ]


# --- names ---------------------------------------------------------------------------------


def ingest_publication(region: str) -> str:
    return f"eventdrop_ingest_{region}"


def region_publication(region: str) -> str:
    return f"eventdrop_region_{region}"


def catalog_publication(region: str) -> str:
    return f"eventdrop_catalog_{region}"


def state_raw_publication(region: str) -> str:
    return f"eventdrop_state_raw_{region}"


def state_publication(region: str) -> str:
    return f"eventdrop_state_{region}"


def subscription_name(region: str, peer: str) -> str:
    return f"eventdrop_{region}_from_{peer}"


def all_publications(region: str) -> list[str]:
    return [
        ingest_publication(region),
        region_publication(region),
        catalog_publication(region),
        state_raw_publication(region),
        state_publication(region),
    ]


def state_free_publications(region: str) -> list[str]:
    return [ingest_publication(region), region_publication(region), catalog_publication(region)]


def _identifiers(names: list[str]) -> sql.Composable:
    return sql.SQL(", ").join(sql.Identifier(name) for name in names)


def _run(statement: sql.Composable) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement.as_string(None))


# --- publications and functions (region_setup, in one transaction) -------------------------


def setup_statements(region: str) -> list[str]:
    """CREATE or re-define this region's publications and both functions (idempotent), then
    take EXECUTE from PUBLIC: PostgreSQL grants it on every new function, SECURITY DEFINER
    ones included; `manage.py db_roles` grants each to its roles."""
    return [
        *publication_statements(region),
        publish_state_function(region),
        subscription_without_state_function(region),
        *(
            f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC"
            for signature in (PUBLISH_STATE_SIGNATURE, WITHOUT_STATE_SIGNATURE)
        ),
    ]


def publication_statements(region: str) -> list[str]:
    """Why each publication carries what it does: docs/multi-region.md, "What crosses"."""
    raw, decision, state = (
        sql.Identifier(RawEvent._meta.db_table),
        sql.Identifier(ProcessingDecision._meta.db_table),
        sql.Identifier(RegionState._meta.db_table),
    )
    me = sql.Literal(region)
    # A restored row stays in the region that restored it: the peer may still hold it, and a
    # second INSERT of the key would stop the peer's apply worker.
    restored = sql.Literal(RawEventOrigin.RESTORED.value)
    ingest_tables = sql.SQL(
        "TABLE {raw} WHERE (region = {me} AND origin <> {restored}), "
        "TABLE {decision} WHERE (decided_in = {me})"
    ).format(raw=raw, me=me, restored=restored, decision=decision)
    region_tables = sql.SQL("TABLE {} WHERE (name = {})").format(state, me)
    # The catalog publishes nothing: it lists every state table so that a subscriber applies
    # their changes once the state publications fill (it applies only to tables it lists).
    catalog_tables = sql.SQL(", ").join(
        sql.SQL("TABLE {}").format(sql.Identifier(table)) for table in state_tables()
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT pubname FROM pg_publication")
        existing = {row[0] for row in cursor.fetchall()}
    statements: list[sql.Composable] = []
    published: tuple[tuple[str, sql.Composable | None, str], ...] = (
        (ingest_publication(region), ingest_tables, "insert"),
        (region_publication(region), region_tables, "insert, update"),
        (catalog_publication(region), catalog_tables, ""),
        (state_raw_publication(region), None, "update"),
        (state_publication(region), None, "insert, update, delete"),
    )
    for name, tables, publish in published:
        if name in existing:
            if tables is not None:
                statements.append(
                    sql.SQL("ALTER PUBLICATION {} SET {}").format(sql.Identifier(name), tables)
                )
            continue
        statements.append(
            sql.SQL(
                "CREATE PUBLICATION {name} {tables}"
                "WITH (publish = {publish}, publish_via_partition_root = true)"
            ).format(
                name=sql.Identifier(name),
                tables=sql.SQL("FOR {} ").format(tables) if tables is not None else sql.SQL(""),
                publish=sql.Literal(publish),
            )
        )
    return [statement.as_string(None) for statement in statements]


def publish_state_function(region: str) -> str:
    """`eventdrop_region_publish_state(on)`: fill or empty this region's state publications.

    SECURITY DEFINER so that the inbox's role may call it without owning them. Called in the
    transaction that records the acknowledgement: every state change before it is published,
    none after (PostgreSQL decodes a change against the catalog as of that change)."""
    raw = sql_literal(RawEvent._meta.db_table)
    state_list = ", ".join(sql_literal(table) for table in state_tables())
    state_raw, state = (
        sql_literal(state_raw_publication(region)),
        sql_literal(state_publication(region)),
    )
    return f"""
CREATE OR REPLACE FUNCTION {PUBLISH_STATE_FUNCTION}(publish boolean) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_catalog AS $fn$
DECLARE
  want text[] := ARRAY[{state_list}];
  publication text;
  member text;
  changed boolean := false;
BEGIN
  IF publish THEN
    IF NOT EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
                   WHERE p.pubname = {state_raw}) THEN
      EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I', {state_raw}, {raw});
      changed := true;
    END IF;
    FOREACH member IN ARRAY want LOOP
      IF NOT EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
                     WHERE p.pubname = {state} AND pr.prrelid = member::regclass) THEN
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I', {state}, member);
        changed := true;
      END IF;
    END LOOP;
  ELSE
    FOR publication, member IN
        SELECT p.pubname, c.relname FROM pg_publication_rel pr
        JOIN pg_publication p ON p.oid = pr.prpubid
        JOIN pg_class c ON c.oid = pr.prrelid
        WHERE p.pubname IN ({state_raw}, {state}) LOOP
      EXECUTE format('ALTER PUBLICATION %I DROP TABLE %I', publication, member);
      changed := true;
    END LOOP;
  END IF;
  RETURN changed;
END
$fn$"""  # noqa: S608


def subscription_without_state_function(region: str) -> str:
    """`eventdrop_region_subscription_without_state(peer)`: the takeover's re-pointing, for the
    console's role, which does not own the subscription (docs/multi-region.md, "Database
    roles"). It checks the peer's name and builds every name itself (format('%I')), so it can
    re-point nothing but this region's subscription from a peer, to its state-free
    publications."""
    prefix = sql_literal(subscription_name(region, ""))
    ingest, own, catalog = (
        sql_literal(ingest_publication("")),
        sql_literal(region_publication("")),
        sql_literal(catalog_publication("")),
    )
    return f"""
CREATE OR REPLACE FUNCTION {WITHOUT_STATE_FUNCTION}(peer text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_catalog AS $fn$
DECLARE
  sub text;
BEGIN
  IF peer !~ '^[a-z][a-z0-9_]{{0,30}}$' OR peer = {sql_literal(region)} THEN
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


def publish_state(on: bool) -> bool:
    """Fill (on) or empty this region's state publications; whether anything changed."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {PUBLISH_STATE_FUNCTION}(%s)", [on])
        return bool(cursor.fetchone()[0])


def subscription_without_state(region: str, peer: str, *, direct_if_no_function: bool) -> bool:
    """At a takeover: stop taking the lost peer's state now, without reaching it (no refresh).
    False when this region has no subscription from the peer. Through the function when it
    exists (a name not a peer's raises); else `direct_if_no_function` runs the ALTER itself,
    which needs the subscription's owner, and without it the missing function raises."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regprocedure(%s) IS NOT NULL", [WITHOUT_STATE_SIGNATURE])
        if cursor.fetchone()[0] or not direct_if_no_function:
            cursor.execute(f"SELECT {WITHOUT_STATE_FUNCTION}(%s)", [peer])
            return bool(cursor.fetchone()[0])
    name = subscription_name(region, peer)
    if subscription(name) is None:
        return False
    subscription_set_publications(name, state_free_publications(peer), refresh=False)
    return True


# --- subscriptions -------------------------------------------------------------------------
# CREATE SUBSCRIPTION and ALTER SUBSCRIPTION … with refresh cannot run in a transaction block:
# their callers run in autocommit (no atomic around them).


@dataclass(frozen=True)
class Subscription:
    publications: list[str]
    enabled: bool


def subscription(name: str) -> Subscription | None:
    """This database's subscription `name` as the catalog shows it, or None."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT subpublications, subenabled FROM pg_subscription s JOIN pg_database d "
            "ON d.oid = s.subdbid WHERE d.datname = current_database() AND s.subname = %s",
            [name],
        )
        row = cursor.fetchone()
    return None if row is None else Subscription(list(row[0]), bool(row[1]))


def subscription_create(name: str, url: str, publications: list[str]) -> None:
    """With copy_data: the peer's rows from before the subscription's slot existed arrive too."""
    _run(
        sql.SQL(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (copy_data = true)"
        ).format(sql.Identifier(name), sql.Literal(url), _identifiers(publications))
    )


def subscription_set_publications(
    name: str, publications: list[str], *, refresh: bool, copy_data: bool = False
) -> None:
    """With refresh, the tables new to the subscription are added (and copied with copy_data),
    those no longer published dropped; without, nothing is asked of the publisher."""
    options: sql.Composable = sql.SQL("refresh = false")
    if refresh:
        copy = sql.SQL("true" if copy_data else "false")
        options = sql.SQL("refresh = true, copy_data = {}").format(copy)
    _run(
        sql.SQL("ALTER SUBSCRIPTION {} SET PUBLICATION {} WITH ({})").format(
            sql.Identifier(name), _identifiers(publications), options
        )
    )


def subscription_refresh(name: str) -> None:
    """Take the tables added to the publications since; their earlier rows are not copied (both
    regions migrated them, and a copy could collide). Needs an enabled subscription."""
    _run(
        sql.SQL("ALTER SUBSCRIPTION {} REFRESH PUBLICATION WITH (copy_data = false)").format(
            sql.Identifier(name)
        )
    )


def subscription_enable(name: str, enabled: bool) -> None:
    """DISABLE returns at once; the apply worker stops between transactions (see
    subscription_workers_gone)."""
    action = sql.SQL("ENABLE" if enabled else "DISABLE")
    _run(sql.SQL("ALTER SUBSCRIPTION {} {}").format(sql.Identifier(name), action))


def subscription_workers_gone(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_subscription WHERE subname = %s AND pid IS NOT NULL",
            [name],
        )
        return cursor.fetchone()[0] == 0


def subscription_ready_tables(name: str) -> set[str]:
    """The tables the subscription lists and has synchronised ('r')."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_subscription_rel r "
            "JOIN pg_subscription s ON s.oid = r.srsubid "
            "JOIN pg_class c ON c.oid = r.srrelid "
            "WHERE s.subname = %s AND r.srsubstate = 'r'",
            [name],
        )
        return {row[0] for row in cursor.fetchall()}
