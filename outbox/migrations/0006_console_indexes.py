# The console's dead rows, drain rate and error-class filter (docs/console.md), built
# without blocking writes.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("outbox", "0005_queue_claimed_by_and_deaths"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="recapsideeffect",
            index=models.Index(
                condition=models.Q(("status", "dead")),
                fields=["id"],
                name="recap_side_effect_dead",
            ),
        ),
        AddIndexConcurrently(
            model_name="recapsideeffect",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["finished_at"],
                name="recap_side_effect_finished",
            ),
        ),
        AddIndexConcurrently(
            model_name="recapsideeffect",
            index=models.Index(
                condition=models.Q(("last_error_class", ""), _negated=True),
                fields=["last_error_class", "id"],
                name="recap_side_effect_error",
            ),
        ),
    ]
