from django.apps import AppConfig


class RecapsConfig(AppConfig):
    name = "recaps"
    verbose_name = "Recaps"
