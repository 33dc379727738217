"""The render service's callback handler moved from recaps.handlers to outbox.handlers (the
outbox owns the render service). Deliveries store their handler's dotted path, so existing
ones (pending, dead and replayable, done for the record) are renamed with it; otherwise the
inbox would find no handler for them."""

from django.db import migrations

OLD = "recaps.handlers.record_render_result"
NEW = "outbox.handlers.record_render_result"


def rename(apps, schema_editor, *, old: str, new: str) -> None:
    Delivery = apps.get_model("ingress", "Delivery")
    Delivery.objects.filter(handler=old).update(handler=new)


class Migration(migrations.Migration):
    dependencies = [
        ("outbox", "0002_judged_by_real_calls"),
        ("ingress", "0007_rawevent_restored"),
    ]

    operations = [
        migrations.RunPython(
            lambda apps, editor: rename(apps, editor, old=OLD, new=NEW),
            lambda apps, editor: rename(apps, editor, old=NEW, new=OLD),
        ),
    ]
