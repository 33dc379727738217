# Finished deliveries counted per handler too (the per-handler pace on /ops/, /api/queues/ and
# /metrics, issue 41): 0009's delivery triggers write the handler where the raw events' write
# their source, in a column widened for it (a varchar widening rewrites nothing).

import importlib

from django.db import migrations, models

buckets = importlib.import_module("console.migrations.0009_volume_buckets")


def _finished_rows(rows: str, source: str) -> str:
    return (
        f"SELECT 'finished' AS kind, {buckets.FINISHED.format(rows=rows)} AS bucket, "
        f"{source.format(rows=rows)} AS source, {rows}.status, '' AS reason, 1 AS delta"
    )


def delivery_functions(source: str) -> list[str]:
    inserted = (
        f"WITH deltas AS ({_finished_rows('n', source)} FROM new_rows n"
        f" WHERE n.status IN {buckets.FINISHED_STATUSES}) " + buckets.UPSERT
    )
    updated = (
        f"WITH deltas AS ({_finished_rows('n', source)} FROM old_rows o"
        " JOIN new_rows n ON n.id = o.id"
        f" WHERE n.status IN {buckets.FINISHED_STATUSES} AND n.status IS DISTINCT FROM o.status) "
        + buckets.UPSERT
    )
    return [
        buckets._function("console_delivery_inserted", inserted),
        buckets._function("console_delivery_updated", updated),
    ]


class Migration(migrations.Migration):

    dependencies = [
        ("console", "0010_ack_rollup_marks"),
    ]

    operations = [
        migrations.AlterField(
            model_name="volumebucket",
            name="source",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.RunSQL(
            delivery_functions("left({rows}.handler, 255)"), delivery_functions("''")
        ),
    ]
