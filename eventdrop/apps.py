from django.apps import AppConfig


class EventDropConfig(AppConfig):
    # The project's wiring (settings, URLs, the web server) as an app, so that the web
    # server's checks are registered; the other system checks live with what they check
    # (ingress/checks.py, outbox/checks.py, recaps/checks.py, kernel/db/checks.py).
    name = "eventdrop"
    verbose_name = "EventDrop"

    def ready(self) -> None:
        from eventdrop import checks  # noqa: F401 (registers the web server checks)
