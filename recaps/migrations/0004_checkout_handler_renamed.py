"""The Stripe handler recaps.handlers.mark_recap_paid became record_checkout_session: one
handler for every checkout.session.* event (the inbox orders one session's events per
handler). Deliveries store their handler's dotted path, so existing ones are renamed with
it; otherwise the inbox would find no handler for them."""

from django.db import migrations

OLD = "recaps.handlers.mark_recap_paid"
NEW = "recaps.handlers.record_checkout_session"


def rename(apps, schema_editor, *, old: str, new: str) -> None:
    Delivery = apps.get_model("ingress", "Delivery")
    Delivery.objects.filter(handler=old).update(handler=new)


class Migration(migrations.Migration):
    dependencies = [
        ("recaps", "0003_checkout_expired_and_awaiting_payment_reason"),
        ("ingress", "0007_rawevent_restored"),
    ]

    operations = [
        migrations.RunPython(
            lambda apps, editor: rename(apps, editor, old=OLD, new=NEW),
            lambda apps, editor: rename(apps, editor, old=NEW, new=OLD),
        ),
    ]
