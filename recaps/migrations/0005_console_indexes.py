# The console's recap lists, newest first, and its exact searches (docs/console.md), built
# without blocking writes.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("recaps", "0004_checkout_handler_renamed"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="recapvideo",
            index=models.Index(fields=["updated_at"], name="recap_updated"),
        ),
        AddIndexConcurrently(
            model_name="recapvideo",
            index=models.Index(fields=["created_at", "id"], name="recap_created"),
        ),
        AddIndexConcurrently(
            model_name="recapvideo",
            index=models.Index(
                condition=models.Q(("checkout_session_id", ""), _negated=True),
                fields=["checkout_session_id"],
                name="recap_checkout_session",
            ),
        ),
        AddIndexConcurrently(
            model_name="recapvideo",
            index=models.Index(
                condition=models.Q(("render_id", ""), _negated=True),
                fields=["render_id"],
                name="recap_render_id",
            ),
        ),
    ]
