# Fair claims and handler limits (docs/queue.md, "Fair shares and limits"). The claims go
# round the sources and the handlers, so their pending indexes lead with the source and the
# handler: each new index is built first, without blocking writes (concurrently, partition
# by partition on the raw store: kernel/db/indexes.py), then the one it replaces is dropped.
# Dropping a partitioned index cannot be concurrent: it waits at most LOCK_TIMEOUT for its
# brief lock, and a run stopped there is run again.

import django.utils.timezone
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

from kernel.db.indexes import AddPartitionedIndexConcurrently

LOCK_TIMEOUT = "5s"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ingress", "0021_traceparent"),
    ]

    operations = [
        migrations.CreateModel(
            name="HandlerPace",
            fields=[
                ("handler", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("tokens", models.FloatField(default=0.0)),
                ("refilled_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("not_before", models.DateTimeField(blank=True, null=True)),
                ("factor", models.FloatField(default=1.0)),
                ("slowed_until", models.DateTimeField(blank=True, null=True)),
                ("rate_limited", models.BigIntegerField(default=0)),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("tokens__gte", 0), ("factor__gt", 0), ("factor__lte", 1)
                        ),
                        name="handlerpace_bounds",
                    )
                ],
            },
        ),
        AddPartitionedIndexConcurrently(
            model_name="rawevent",
            index=models.Index(
                condition=models.Q(("signature_status", "pending")),
                fields=["source", "received_at"],
                name="rawevent_pending_source",
            ),
        ),
        migrations.RunSQL(f"SET lock_timeout = '{LOCK_TIMEOUT}'", "RESET lock_timeout"),
        migrations.RemoveIndex(model_name="rawevent", name="rawevent_pending"),
        migrations.RunSQL("RESET lock_timeout", f"SET lock_timeout = '{LOCK_TIMEOUT}'"),
        AddIndexConcurrently(
            model_name="delivery",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["handler", "next_attempt_at"],
                name="delivery_due_handler",
            ),
        ),
        RemoveIndexConcurrently(model_name="delivery", name="delivery_due"),
    ]
