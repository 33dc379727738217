"""An index added to a big table without blocking its writes, for migrations (`atomic = False`).

PostgreSQL builds `CREATE INDEX CONCURRENTLY` while INSERTs and UPDATEs go on, but not on a
partitioned table. There the documented way is: the index on the parent alone (`ON ONLY`,
invalid, no rows read), one concurrent build per partition, each attached to it; the parent
index turns valid once every partition's is attached, and later partitions get theirs at
CREATE. Each step is idempotent, so a migration stopped half-way is run again.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.backends.utils import CursorWrapper
from django.db.migrations.state import ProjectState
from django.db.models import Index, Model


def _partitions(cursor: CursorWrapper, table: str) -> list[str]:
    cursor.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = %s::regclass ORDER BY c.relname",
        [table],
    )
    return [name for (name,) in cursor.fetchall()]


def _index_sql(
    schema_editor: BaseDatabaseSchemaEditor, model: type[Model], index: Index
) -> tuple[str, str]:
    """(the columns and WHERE of `index`, as Django writes them) for a table of our own."""
    statement = str(index.create_sql(model, schema_editor))
    columns = statement[statement.index("(") :]
    return statement, columns


def create_partitioned_index(
    schema_editor: BaseDatabaseSchemaEditor, model: type[Model], index: Index
) -> None:
    quote = schema_editor.quote_name
    table = model._meta.db_table
    statement, columns = _index_sql(schema_editor, model, index)
    with schema_editor.connection.cursor() as cursor:
        partitions = _partitions(cursor, table)
        if not partitions:  # not partitioned (another database): the plain statement
            cursor.execute(statement.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1))
            return
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {quote(index.name)} ON ONLY {quote(table)} {columns}"
        )
        for partition in partitions:
            child = f"{partition}_{index.name}"[:63]
            cursor.execute(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {quote(child)} "
                f"ON {quote(partition)} {columns}"
            )
            cursor.execute(
                "SELECT 1 FROM pg_inherits WHERE inhrelid = %s::regclass "
                "AND inhparent = %s::regclass",
                [child, index.name],
            )
            if cursor.fetchone() is None:
                cursor.execute(f"ALTER INDEX {quote(index.name)} ATTACH PARTITION {quote(child)}")


class AddPartitionedIndexConcurrently(migrations.AddIndex):
    """migrations.AddIndex, built as the module docstring says (its migration: atomic=False)."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            create_partitioned_index(schema_editor, model, self.index)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.execute(
                f"DROP INDEX IF EXISTS {schema_editor.quote_name(self.index.name)}"
            )
