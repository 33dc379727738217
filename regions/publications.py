"""The publications and subscriptions of the regions (docs/multi-region.md, the table
"What crosses, on which publication"), as SQL run by region_setup and by the processing
gate. Names are built from region names the checks validated (regions.configuration.NAME)
and table names from model metadata; no other input reaches the SQL text.

PostgreSQL 15 has no `origin = none`: a change a subscription applied is published again by
the subscriber's publications. So every publication carries only changes its own region
made: the raw rows and decisions it inserted (row filter on the region, insert only: an
insert-only publication needs no replica identity for its filter), its own region row
(filtered on its primary key), and — only while it is the processing region — every update
of the raw rows and every change of the processing-state tables (unfiltered: only the
processing region writes them). The state publications exist in every region and are
emptied when it stops processing (`eventdrop_region_publish_state`), so the standby's own
apply of that state is never published back.
"""

from django.apps import apps
from django.db import connection, models

from ingress.models import RawEvent, RawEventOrigin
from regions.models import ProcessingDecision, RegionState

# Tables only the processing region writes: published whole, from there. Every other
# table of the project is local to its region (users, sessions, API tokens, django-q2, the
# console's audit trail and jobs, the ACK latency roll-up).
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


def state_tables() -> list[str]:
    return [apps.get_model(label)._meta.db_table for label in STATE_MODELS]


def state_primary_keys() -> list[tuple[str, str]]:
    """(table, primary key column) of every state table (each has a one-column key)."""
    return [
        (model._meta.db_table, model._meta.pk.column)
        for model in (apps.get_model(label) for label in STATE_MODELS)
    ]


def id_tables() -> list[str]:
    """Tables whose rows cross regions and take ids from a sequence (an auto `id`): each
    region's sequence hands out ids in its own block."""
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


def ingest_publication(region: str) -> str:
    return f"eventdrop_ingest_{region}"


def region_publication(region: str) -> str:
    return f"eventdrop_region_{region}"


def state_raw_publication(region: str) -> str:
    return f"eventdrop_state_raw_{region}"


def state_publication(region: str) -> str:
    return f"eventdrop_state_{region}"


def catalog_publication(region: str) -> str:
    return f"eventdrop_catalog_{region}"


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


def without_state(region: str) -> list[str]:
    return [ingest_publication(region), region_publication(region), catalog_publication(region)]


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _literal(value: str) -> str:
    # Region names match regions.configuration.NAME (letters, digits, underscore).
    return "'" + value.replace("'", "''") + "'"


def publication_statements(region: str) -> list[str]:
    """CREATE or re-define this region's four publications (idempotent)."""
    raw, decision, state = (
        _q(RawEvent._meta.db_table),
        _q(ProcessingDecision._meta.db_table),
        _q(RegionState._meta.db_table),
    )
    me = _literal(region)
    # A row restored from an archive stays where it was restored: the peer may still hold it
    # (its retention did not drop that day), and a second INSERT of the same key would stop
    # the peer's apply worker. Each region restores into its own view (docs/multi-region.md).
    restored = _literal(RawEventOrigin.RESTORED)
    ingest_tables = (
        f"TABLE {raw} WHERE (region = {me} AND origin <> {restored}), "
        f"TABLE {decision} WHERE (decided_in = {me})"
    )
    region_tables = f"TABLE {state} WHERE (name = {me})"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pubname FROM pg_publication")
        existing = {row[0] for row in cursor.fetchall()}
    # The catalog publishes nothing: it holds every state table so that a subscriber lists
    # them (pg_subscription_rel) from the start. A subscriber applies changes only to tables
    # it lists, and the state publications are filled later, when their region processes.
    catalog_tables = ", ".join(f"TABLE {_q(table)}" for table in state_tables())
    statements = []
    for name, tables, publish in (
        (ingest_publication(region), ingest_tables, "insert"),
        (region_publication(region), region_tables, "insert, update"),
        (catalog_publication(region), catalog_tables, ""),
    ):
        if name in existing:
            statements.append(f"ALTER PUBLICATION {_q(name)} SET {tables}")
        else:
            statements.append(
                f"CREATE PUBLICATION {_q(name)} FOR {tables} "
                f"WITH (publish = '{publish}', publish_via_partition_root = true)"
            )
    for name, publish in (
        (state_raw_publication(region), "update"),
        (state_publication(region), "insert, update, delete"),
    ):
        if name not in existing:
            statements.append(
                f"CREATE PUBLICATION {_q(name)} "
                f"WITH (publish = '{publish}', publish_via_partition_root = true)"
            )
    statements.append(publish_state_function(region))
    return statements


PUBLISH_STATE_SIGNATURE = "eventdrop_region_publish_state(boolean)"


def publish_state_function(region: str) -> str:
    """`eventdrop_region_publish_state(on)`: fill or empty this region's state publications.

    SECURITY DEFINER, owned by the role that ran region_setup (the publications' owner), so
    the inbox's role may call it without owning them. Idempotent: it adds only the tables
    missing and drops only those present. Transactional: called in the transaction that
    records the region's acknowledgement, every state change before it is published and
    none after it (PostgreSQL decodes a change against the catalog as of that change)."""
    raw = _literal(RawEvent._meta.db_table)
    state_list = ", ".join(_literal(t) for t in state_tables())
    # Names from model metadata and validated region names, quoted as literals; no input.
    return f"""
CREATE OR REPLACE FUNCTION eventdrop_region_publish_state(publish boolean) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_catalog AS $fn$
DECLARE
  want text[] := ARRAY[{state_list}];
  publication text;
  member text;
  changed boolean := false;
BEGIN
  IF publish THEN
    IF NOT EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
                   WHERE p.pubname = {_literal(state_raw_publication(region))}) THEN
      EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I',
                     {_literal(state_raw_publication(region))}, {raw});
      changed := true;
    END IF;
    FOREACH member IN ARRAY want LOOP
      IF NOT EXISTS (SELECT 1 FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
                     WHERE p.pubname = {_literal(state_publication(region))}
                       AND pr.prrelid = member::regclass) THEN
        EXECUTE format('ALTER PUBLICATION %I ADD TABLE %I',
                       {_literal(state_publication(region))}, member);
        changed := true;
      END IF;
    END LOOP;
  ELSE
    FOR publication, member IN
        SELECT p.pubname, c.relname FROM pg_publication_rel pr
        JOIN pg_publication p ON p.oid = pr.prpubid
        JOIN pg_class c ON c.oid = pr.prrelid
        WHERE p.pubname IN ({_literal(state_raw_publication(region))},
                            {_literal(state_publication(region))}) LOOP
      EXECUTE format('ALTER PUBLICATION %I DROP TABLE %I', publication, member);
      changed := true;
    END LOOP;
  END IF;
  RETURN changed;
END
$fn$"""  # noqa: S608


def publish_state(on: bool) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT eventdrop_region_publish_state(%s)", [on])
        return bool(cursor.fetchone()[0])


def subscription_without_state(region: str, peer: str) -> bool:
    """At a takeover: stop taking the lost peer's state at once, without reaching it (no
    refresh: a refresh connects to the publisher). Its raw events and region row still come,
    when it returns; its unsent tail of processing state does not (docs/multi-region.md).
    False when this region has no subscription from the peer (not set up)."""
    name = subscription_name(region, peer)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid "
            "WHERE d.datname = current_database() AND s.subname = %s",
            [name],
        )
        if cursor.fetchone() is None:
            return False
        pubs = ", ".join(_q(pub) for pub in without_state(peer))
        cursor.execute(
            f"ALTER SUBSCRIPTION {_q(name)} SET PUBLICATION {pubs} WITH (refresh = false)"
        )
    return True
