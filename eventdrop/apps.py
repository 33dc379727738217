from django.apps import AppConfig


class EventDropConfig(AppConfig):
    # An app so that its management commands (ensure_schedules) are found; the system
    # checks live with what they check (ingress/checks.py, outbox/checks.py, recaps/checks.py).
    name = "eventdrop"
    verbose_name = "EventDrop"
