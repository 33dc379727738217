from django.apps import AppConfig


class RecapsConfig(AppConfig):
    name = "recaps"
    verbose_name = "Recaps"

    def ready(self) -> None:
        from recaps import checks  # noqa: F401  (registers the system checks)
