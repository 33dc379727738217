# Written by hand: the raw store is a partitioned table of up to ~90 million rows, so neither
# change below may rewrite it or hold a lock that stops webhook INSERTs while it scans.
#
# 1. The signature status CHECK gains `questioned`. Django would drop and add it, validated
#    at once under the ACCESS EXCLUSIVE lock that ADD CONSTRAINT takes: every INSERT waits for
#    a scan of every partition. Instead: the new constraint NOT VALID (no scan; the lock is
#    held for a catalog change only), the old one dropped, then VALIDATE, which scans under
#    SHARE UPDATE EXCLUSIVE (INSERTs and UPDATEs go on), then the new one takes the old name,
#    which new partitions copy (ingress/partitions.py creates them LIKE the parent).
# 2. The partial index `rawevent_questioned`: PostgreSQL has no CREATE INDEX CONCURRENTLY on a
#    partitioned table, so the parent's index is created ON ONLY the parent (invalid, empty),
#    each partition's CONCURRENTLY, and each attached; the parent's turns valid with the last.
#
# Each statement runs in its own transaction (atomic = False) under a short lock_timeout, and
# each step looks at the catalog first: a run stopped half-way is run again from where it was.

from django.db import migrations, models

TABLE = "ingress_rawevent"
OLD = "rawevent_signature_status_valid"
NEW = "rawevent_signature_status_valid_q"
STATUSES = ("pending", "verified", "rejected", "questioned")
INDEX = "rawevent_questioned"
LOCK_TIMEOUT = "5s"


def _one(cursor, sql, params=()):
    cursor.execute(sql, params)
    row = cursor.fetchone()
    return row[0] if row else None


def _constraint_exists(cursor, name):
    return bool(
        _one(
            cursor,
            "SELECT 1 FROM pg_constraint WHERE conrelid = %s::regclass AND conname = %s",
            [TABLE, name],
        )
    )


def widen_status_check(apps, schema_editor):
    statuses = ", ".join(f"'{status}'" for status in STATUSES)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        if _constraint_exists(cursor, OLD) and not _constraint_exists(cursor, NEW):
            cursor.execute(
                f'ALTER TABLE "{TABLE}" ADD CONSTRAINT "{NEW}" '
                f'CHECK ("signature_status"::text IN ({statuses})) NOT VALID'
            )
        if _constraint_exists(cursor, NEW):
            if _constraint_exists(cursor, OLD):
                cursor.execute(f'ALTER TABLE "{TABLE}" DROP CONSTRAINT "{OLD}"')
            cursor.execute(f'ALTER TABLE "{TABLE}" VALIDATE CONSTRAINT "{NEW}"')
            cursor.execute(f'ALTER TABLE "{TABLE}" RENAME CONSTRAINT "{NEW}" TO "{OLD}"')
        cursor.execute("RESET lock_timeout")


def narrow_status_check(apps, schema_editor):
    statuses = ", ".join(f"'{status}'" for status in STATUSES if status != "questioned")
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{TABLE}" DROP CONSTRAINT IF EXISTS "{OLD}"')
        cursor.execute(
            f'ALTER TABLE "{TABLE}" ADD CONSTRAINT "{OLD}" '
            f'CHECK ("signature_status"::text IN ({statuses}))'
        )


def create_questioned_index(apps, schema_editor):
    quote = schema_editor.quote_name
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {quote(INDEX)} ON ONLY {quote(TABLE)} (received_at) "
            "WHERE signature_status = 'questioned'"
        )
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass ORDER BY c.relname",
            [TABLE],
        )
        partitions = [name for (name,) in cursor.fetchall()]
        for partition in partitions:
            attached = _one(
                cursor,
                "SELECT 1 FROM pg_inherits i JOIN pg_index x ON x.indexrelid = i.inhrelid "
                "WHERE i.inhparent = %s::regclass AND x.indrelid = %s::regclass",
                [INDEX, partition],
            )
            if attached:
                continue
            name = f"{partition}_questioned"[:63]
            # A CONCURRENTLY build that failed leaves an invalid index: built again.
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quote(name)}")
            cursor.execute(
                f"CREATE INDEX CONCURRENTLY {quote(name)} ON {quote(partition)} (received_at) "
                "WHERE signature_status = 'questioned'"
            )
            cursor.execute(f"ALTER INDEX {quote(INDEX)} ATTACH PARTITION {quote(name)}")
        cursor.execute("RESET lock_timeout")


def drop_questioned_index(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(INDEX)}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ingress", "0018_signature_question"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="rawevent", name=OLD),
                migrations.AddConstraint(
                    model_name="rawevent",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("signature_status__in", list(STATUSES))), name=OLD
                    ),
                ),
                migrations.AddIndex(
                    model_name="rawevent",
                    index=models.Index(
                        condition=models.Q(("signature_status", "questioned")),
                        fields=["received_at"],
                        name=INDEX,
                    ),
                ),
            ],
            database_operations=[
                migrations.RunPython(widen_status_check, narrow_status_check),
                migrations.RunPython(create_questioned_index, drop_questioned_index),
            ],
        ),
    ]
