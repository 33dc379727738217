from django.apps import AppConfig


class EventDropConfig(AppConfig):
    name = "eventdrop"
    verbose_name = "EventDrop"

    def ready(self) -> None:
        from eventdrop import checks  # noqa: F401  (registers the system checks)
