from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class IngressConfig(AppConfig):
    name = "ingress"
    verbose_name = "Webhook ingress"

    def ready(self) -> None:
        from ingress import checks  # noqa: F401  (registers the system checks)

        # Every app declares its webhook handlers in `<app>/handlers.py`; importing them
        # here fills the registry in one place (see ingress/handlers.py).
        autodiscover_modules("handlers")
