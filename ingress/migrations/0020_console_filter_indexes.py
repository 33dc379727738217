# The console's filters and searches on the raw store and the deliveries, each served by an
# index (docs/console.md, "What a page costs"). Built without blocking writes: concurrently,
# partition by partition on the raw store (kernel/db/indexes.py), so `atomic = False`.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from kernel.db.indexes import AddPartitionedIndexConcurrently

RAW_EVENT_INDEXES = [
    models.Index(
        condition=models.Q(("signature_status", "rejected")),
        fields=["received_at"],
        name="rawevent_rejected",
    ),
    models.Index(
        condition=models.Q(("signature_status", "rejected")),
        fields=["rejection_reason", "received_at"],
        name="rawevent_rejected_reason",
    ),
    models.Index(
        condition=models.Q(("dispatch_status__in", ["no_handler", "duplicate", "not_dispatched"])),
        fields=["dispatch_status", "received_at"],
        name="rawevent_undispatched",
    ),
    models.Index(
        condition=models.Q(("origin", "received"), _negated=True),
        fields=["origin", "received_at"],
        name="rawevent_origin",
    ),
    models.Index(fields=["source", "received_at"], name="rawevent_source_received"),
    models.Index(
        condition=models.Q(("event_type", ""), _negated=True),
        fields=["event_type", "received_at"],
        name="rawevent_event_type",
    ),
    models.Index(
        condition=models.Q(("delivery_id", ""), _negated=True),
        fields=["delivery_id"],
        name="rawevent_delivery_id",
    ),
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ingress", "0019_rawevent_questioned"),
    ]

    operations = [
        *(
            AddPartitionedIndexConcurrently(model_name="rawevent", index=index)
            for index in RAW_EVENT_INDEXES
        ),
        AddIndexConcurrently(
            model_name="delivery",
            index=models.Index(fields=["handler", "id"], name="delivery_handler"),
        ),
    ]
