from django.db import migrations, models


class Migration(migrations.Migration):
    """`origin` gains `restored` (choices only, no SQL) and `restored_at` (nullable, no
    default: catalog-only on the partitioned table)."""

    dependencies = [
        ("ingress", "0006_rawevent_body_encryption"),
    ]

    operations = [
        migrations.AlterField(
            model_name="rawevent",
            name="origin",
            field=models.CharField(
                choices=[
                    ("received", "received (a webhook request)"),
                    ("backfilled", "backfilled (fetched from the provider's API)"),
                    ("restored", "restored (from an archive past retention)"),
                ],
                db_default="received",
                default="received",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="rawevent",
            name="restored_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
