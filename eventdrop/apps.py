from django.apps import AppConfig


class EventDropConfig(AppConfig):
    # An app so that its management commands (ensure_schedules) are found; the system
    # checks live with what they check (ingress/checks.py, outbox/checks.py, recaps/checks.py,
    # eventdrop/db/checks.py).
    name = "eventdrop"
    verbose_name = "EventDrop"

    def ready(self) -> None:
        from eventdrop.db import checks  # noqa: F401 (registers the check)
