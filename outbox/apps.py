from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    verbose_name = "Outbox"

    def ready(self) -> None:
        from outbox import checks  # noqa: F401  (registers the system checks)
        from outbox.receivers import (
            enqueue_render_for_paid_recap,
            withdraw_render_for_unpaid_recap,
        )
        from recaps.signals import recap_paid, recap_payment_withdrawn

        recap_paid.connect(enqueue_render_for_paid_recap, dispatch_uid="outbox.enqueue_render")
        recap_payment_withdrawn.connect(
            withdraw_render_for_unpaid_recap, dispatch_uid="outbox.withdraw_render"
        )
