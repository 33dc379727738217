from django.apps import AppConfig


class EventDropConfig(AppConfig):
    # An app so that its management commands (ensure_schedules) are found; the system
    # checks live with what they check (ingress/checks.py, outbox/checks.py, recaps/checks.py,
    # eventdrop/db/checks.py, and eventdrop/checks.py for the web server).
    name = "eventdrop"
    verbose_name = "EventDrop"

    def ready(self) -> None:
        from eventdrop import checks  # noqa: F401 (registers the web server checks)
        from eventdrop.db import checks as db_checks  # noqa: F401 (registers the check)
