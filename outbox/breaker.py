"""A circuit breaker whose state lives in the database, shared by every dispatcher.

Why the database: dispatchers run in several django-q2 workers on several hosts, and a
breaker per process would let each of them pay a full timeout per row during an outage
before learning what the others already know. One row per breaker, changed only under
SELECT … FOR UPDATE, is enough at this rate (a few writes per dispatched row).

    closed ──N consecutive service failures──▶ open ──cool-down over──▶ half-open
      ▲                                          ▲                          │
      └──────────── probe succeeds ──────────────┴──── probe fails ─────────┘

While open, a dispatch is skipped as transient *without a network call and without
spending one of the row's attempts* (we never asked the service anything). After the
cool-down exactly one caller gets a probe permit; the dispatcher spends it on a health
check, not on a row (see outbox/dispatcher.py `_probe`), so an outage of any length costs
each row at most the attempts made before the breaker opened. If the probe's worker dies,
another probe is allowed once the worst case of one dispatch has passed.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from outbox.models import BreakerState, CircuitBreaker

logger = logging.getLogger(__name__)

RENDER_SERVICE_BREAKER = "render-service"


@dataclass(frozen=True)
class BreakerConfig:
    failure_threshold: int
    cooldown: timedelta
    # A half-open probe not heard from in this long died with its worker.
    probe_timeout: timedelta

    @classmethod
    def from_settings(cls) -> "BreakerConfig":
        from outbox.budgets import render_dispatch_worst_case

        return cls(
            failure_threshold=settings.RENDER_BREAKER_FAILURE_THRESHOLD,
            cooldown=timedelta(seconds=settings.RENDER_BREAKER_COOLDOWN_SECONDS),
            probe_timeout=timedelta(seconds=render_dispatch_worst_case().seconds),
        )


@dataclass(frozen=True)
class Permit:
    allowed: bool
    probe: bool = False
    # When asking again makes sense (for a skipped row's next_attempt_at).
    retry_at: datetime | None = None


def _locked(name: str) -> CircuitBreaker:
    breaker = CircuitBreaker.objects.select_for_update().filter(name=name).first()
    if breaker is None:
        CircuitBreaker.objects.bulk_create([CircuitBreaker(name=name)], ignore_conflicts=True)
        breaker = CircuitBreaker.objects.select_for_update().get(name=name)
    return breaker


@transaction.atomic
def circuit_breaker_acquire(
    *, name: str, now: datetime | None = None, config: BreakerConfig | None = None
) -> Permit:
    """May a call go out now? Half-open lets exactly one probe through."""
    now = now or timezone.now()
    config = config or BreakerConfig.from_settings()
    breaker = _locked(name)
    if breaker.state == BreakerState.CLOSED:
        return Permit(allowed=True)
    if breaker.state == BreakerState.OPEN and now < breaker.open_until:
        return Permit(allowed=False, retry_at=breaker.open_until)
    if breaker.state == BreakerState.HALF_OPEN:
        probe_deadline = breaker.probe_started_at + config.probe_timeout
        if now < probe_deadline:
            return Permit(allowed=False, retry_at=probe_deadline)
    breaker.state = BreakerState.HALF_OPEN
    breaker.probe_started_at = now
    breaker.save(update_fields=["state", "probe_started_at", "updated_at"])
    logger.info("outbox.breaker.half_open", extra={"breaker": name})
    return Permit(allowed=True, probe=True)


@transaction.atomic
def circuit_breaker_record_success(*, name: str) -> None:
    # One conditional UPDATE: the common case (already closed, no failures) writes nothing.
    closed = (
        CircuitBreaker.objects.filter(name=name)
        .exclude(state=BreakerState.CLOSED, consecutive_failures=0)
        .update(
            state=BreakerState.CLOSED,
            consecutive_failures=0,
            opened_at=None,
            open_until=None,
            probe_started_at=None,
            updated_at=timezone.now(),
        )
    )
    if closed:
        logger.info("outbox.breaker.closed", extra={"breaker": name})


@transaction.atomic
def circuit_breaker_record_failure(
    *,
    name: str,
    error_class: str,
    now: datetime | None = None,
    config: BreakerConfig | None = None,
) -> str:
    """Count one service failure; open (again) at the threshold or when a probe failed."""
    now = now or timezone.now()
    config = config or BreakerConfig.from_settings()
    breaker = _locked(name)
    breaker.consecutive_failures += 1
    breaker.last_error_class = error_class[:64]
    if (
        breaker.state == BreakerState.HALF_OPEN
        or breaker.consecutive_failures >= config.failure_threshold
    ):
        if breaker.state != BreakerState.OPEN:
            breaker.opened_at = now
        breaker.state = BreakerState.OPEN
        breaker.open_until = now + config.cooldown
        breaker.probe_started_at = None
        logger.warning(
            "outbox.breaker.open",
            extra={
                "breaker": name,
                "consecutive_failures": breaker.consecutive_failures,
                "error_class": error_class,
            },
        )
    breaker.save()
    return breaker.state
