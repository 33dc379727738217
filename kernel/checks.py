"""The one queue's holder settings (kernel/queue.py), checked at start-up.

- kernel.E001  CLAIM_HOLDER_BEAT_SECONDS not above 0, or CLAIM_HOLDER_TTL_SECONDS not above
               the worker loop's longest error pause plus a beat: a worker whose database
               went away would be taken for dead before it can give its claims back (a death
               counted, for nothing, on each of their rows)
- kernel.W001  CLAIM_HOLDER_TTL_SECONDS above 60 s: a dead worker's claims wait longer than a
               minute before they are worked again
"""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks

from kernel.worker_loop import MAX_ERROR_SLEEP_SECONDS

WITHIN_A_MINUTE_SECONDS = 60.0


@checks.register()
def check_claim_holders(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    beat = float(settings.CLAIM_HOLDER_BEAT_SECONDS)
    ttl = float(settings.CLAIM_HOLDER_TTL_SECONDS)
    if beat <= 0:
        return [checks.Error("CLAIM_HOLDER_BEAT_SECONDS must be above 0.", id="kernel.E001")]
    shortest = MAX_ERROR_SLEEP_SECONDS + beat
    if ttl <= shortest:
        return [
            checks.Error(
                f"CLAIM_HOLDER_TTL_SECONDS ({ttl:g} s) is not above the worker loop's longest "
                f"error pause ({MAX_ERROR_SLEEP_SECONDS:g} s) and a beat ({beat:g} s): a worker "
                "whose database went away would be taken for dead before it gives its claims "
                "back, and a death counted on each of their rows.",
                hint=f"Raise CLAIM_HOLDER_TTL_SECONDS above {shortest:g} s (default 45 s).",
                id="kernel.E001",
            )
        ]
    if ttl > WITHIN_A_MINUTE_SECONDS:
        return [
            checks.Warning(
                f"CLAIM_HOLDER_TTL_SECONDS ({ttl:g} s) is above a minute: the claims of a worker "
                "that died wait that long before they are worked again.",
                hint="Lower CLAIM_HOLDER_TTL_SECONDS (default 45 s).",
                id="kernel.W001",
            )
        ]
    return []
