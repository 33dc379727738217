from django.apps import AppConfig


class KernelConfig(AppConfig):
    # An app so that its management commands (database_timeouts, ensure_schedules) are found
    # and the database backend's check is registered.
    name = "kernel"
    verbose_name = "EventDrop kernel"

    def ready(self) -> None:
        from kernel import checks  # noqa: F401 (registers the holder check)
        from kernel.db import checks as db_checks  # noqa: F401 (registers the check)
        from kernel.tracing import configure, process_name

        # Before any request or connection: the instrumentations wrap what comes after.
        configure(process=process_name())
