from django.apps import AppConfig


class PacedConfig(AppConfig):
    name = "tests.ingress.paced"
    label = "paced"
