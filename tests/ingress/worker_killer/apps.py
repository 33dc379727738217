import os
import signal
from dataclasses import replace

from django.apps import AppConfig


class WorkerKillerConfig(AppConfig):
    name = "tests.ingress.worker_killer"
    label = "worker_killer"

    def ready(self) -> None:
        # The provider table is the one place a verifier is looked up (ingress/providers.py):
        # Stripe's row, wrapped, kills the worker for a marked body and verifies the rest.
        from ingress import providers
        from tests.ingress.worker_killer.marks import KILL_IN_SETTLE_MARK

        stripe = providers.PROVIDERS["stripe"]

        def verify_or_die(source, request):
            if KILL_IN_SETTLE_MARK in request.body:
                os.kill(os.getpid(), signal.SIGKILL)
            return stripe.verify(source, request)

        providers.PROVIDERS["stripe"] = replace(stripe, verify=verify_or_die)
