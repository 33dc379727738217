from django.apps import AppConfig


class RegionsConfig(AppConfig):
    name = "regions"
    verbose_name = "Regions"

    def ready(self) -> None:
        from kernel.processing_region import (
            install_processing_gate,
            install_processing_writes_guard,
        )
        from regions import checks  # noqa: F401  (registers the region checks)
        from regions.selectors import processing_writes_guard
        from regions.services import region_processing_pass

        install_processing_gate(region_processing_pass)
        install_processing_writes_guard(processing_writes_guard)
