"""A handler's pace, across every worker and process: its declared rate and concurrency, and
the slow-down a downstream asks for with a 429 or Retry-After (docs/queue.md, "Fair shares
and limits").

Both limits are kept by PostgreSQL, so they hold with any number of workers: the claim
locks the pace rows of the limited handlers that have due deliveries (one HandlerPace row a
handler), counts what is in flight (the handler's `processing` deliveries) in a statement
after the lock, takes at most what the rate's tokens and the concurrency leave (one a claim
under a concurrency: a batch runs its deliveries one after another), and writes the tokens
back in the same transaction. A rate is a token bucket: `rate` tokens a second,
at most HANDLER_RATE_BURST_SECONDS of them saved up. A downstream's 429 or Retry-After never
charges the row (it is released, kernel/retry.py); it stops the handler's claims until the
pause it asked for, and halves its rate for HANDLER_SLOWDOWN_SECONDS.
"""

import logging
import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from ingress.handlers import HandlerSpec, all_handlers
from ingress.models import Delivery, HandlerPace
from kernel.db.json_rows import json_rows
from kernel.queue import statement
from kernel.retry import Failure

logger = logging.getLogger("ingress.deliveries")

# The pace rows of the handlers a claim may take, locked: the limited ones with due
# deliveries, and any a downstream paused.
LOCK_PACES = (
    "SELECT p.handler, p.tokens, p.refilled_at, p.not_before, p.factor, p.slowed_until"
    " FROM {pace} AS p WHERE (p.handler = ANY(%(limited)s) AND EXISTS (SELECT 1 FROM {table}"
    " AS d WHERE d.status = 'pending' AND d.handler = p.handler AND d.next_attempt_at"
    " <= %(now)s)) OR p.not_before > %(now)s ORDER BY p.handler FOR UPDATE OF p"
)
# In flight: a handler's claimed deliveries (after the lock: every claim committed before it
# is counted). The processing index holds only the running rows.
IN_FLIGHT = (
    "SELECT handler, count(*) FROM {table} WHERE status = 'processing'"
    " AND handler = ANY(%(handlers)s) GROUP BY handler"
)
SPEND = (
    "UPDATE {pace} AS p SET tokens = v.tokens, refilled_at = v.refilled_at,"
    " factor = v.factor, slowed_until = v.slowed_until FROM json_to_recordset(%(rows)s::json)"
    " AS v(handler text, tokens double precision, refilled_at timestamptz,"
    " factor double precision, slowed_until timestamptz) WHERE p.handler = v.handler"
)
# A downstream's 429 or Retry-After: no claim before `not_before`, the rate halved (at most
# to 1/16) for a while, the tokens spent.
SLOW = (
    "INSERT INTO {pace} AS p (handler, tokens, refilled_at, not_before, factor, slowed_until,"
    " rate_limited) VALUES (%(handler)s, 0, %(not_before)s, %(not_before)s, 0.5, %(until)s, 1)"
    " ON CONFLICT (handler) DO UPDATE SET tokens = 0,"
    " refilled_at = GREATEST(p.refilled_at, excluded.not_before),"
    " not_before = GREATEST(p.not_before, excluded.not_before),"
    " factor = GREATEST(p.factor / 2, 0.0625), slowed_until = excluded.slowed_until,"
    " rate_limited = p.rate_limited + 1"
)
MIN_FACTOR = 0.0625


@dataclass(frozen=True)
class HandlerLimits:
    """A handler's declared limits, after the settings' override. None: unlimited."""

    rate: float | None = None  # deliveries started per second, across every worker
    concurrency: int | None = None  # deliveries in flight at once, across every worker
    # The backlog a bulk replay must clear within BULK_JOB_REPLAY_SLO_SECONDS (manage.py
    # check holds the rate to it); None: not declared.
    replay_volume: int | None = None

    @property
    def limited(self) -> bool:
        return self.rate is not None or self.concurrency is not None

    def burst(self, rate: float) -> float:
        return max(1.0, rate * settings.HANDLER_RATE_BURST_SECONDS)


def handler_limits(spec: HandlerSpec) -> HandlerLimits:
    """The limits declared with the handler (webhook_handler's rate, concurrency and
    replay_volume), each overridden by HANDLER_LIMITS[its name] where that names it (null
    lifts a limit)."""
    override = settings.HANDLER_LIMITS.get(spec.name, {})
    return HandlerLimits(
        rate=override.get("rate", spec.rate),
        concurrency=override.get("concurrency", spec.concurrency),
        replay_volume=override.get("replay_volume", spec.replay_volume),
    )


def limited_handlers() -> dict[str, HandlerLimits]:
    """Every registered handler with a rate or a concurrency."""
    limits = {spec.name: handler_limits(spec) for spec in all_handlers()}
    return {name: limit for name, limit in limits.items() if limit.limited}


@dataclass
class PaceRow:
    handler: str
    tokens: float
    refilled_at: datetime
    not_before: datetime | None
    factor: float
    slowed_until: datetime | None

    def rate(self, limits: HandlerLimits, now: datetime) -> float | None:
        """The rate now: the declared one, slowed while a downstream's slow-down lasts."""
        if limits.rate is None:
            return None
        slowed = self.slowed_until is not None and now < self.slowed_until
        return limits.rate * (self.factor if slowed else 1.0)

    def refill(self, limits: HandlerLimits, now: datetime) -> None:
        if self.slowed_until is not None and now >= self.slowed_until:
            self.factor, self.slowed_until = 1.0, None
        rate = self.rate(limits, now)
        elapsed = max(0.0, (now - self.refilled_at).total_seconds())
        if rate is not None:
            self.tokens = min(limits.burst(rate), self.tokens + rate * elapsed)
        self.refilled_at = max(self.refilled_at, now)


@dataclass
class Paces:
    """The pace rows this claim's transaction locked, and what each handler may take now."""

    rows: dict[str, PaceRow]
    shares: dict[str, int]

    def spend(self, taken: dict[str, int]) -> None:
        """Write back the tokens of the rows taken (in the claim's transaction)."""
        for name, count in taken.items():
            if name in self.rows:
                self.rows[name].tokens = max(0.0, self.rows[name].tokens - count)
                self.shares[name] = max(0, self.shares.get(name, count) - count)
        if not self.rows:
            return
        rows = json_rows(
            ("handler", "tokens", "refilled_at", "factor", "slowed_until"),
            (
                (row.handler, row.tokens, row.refilled_at, row.factor, row.slowed_until)
                for row in self.rows.values()
            ),
        )
        with connection.cursor() as cursor:
            cursor.execute(_sql(SPEND), {"rows": rows})


def _sql(sql: str) -> str:
    return statement(
        sql, Delivery._meta.db_table, pace=connection.ops.quote_name(HandlerPace._meta.db_table)
    )


def paces_lock(*, now: datetime, limit: int) -> Paces:
    """In the claim's transaction: lock the pace rows that bound it, and say how many
    deliveries each of their handlers may take now (at most `limit`). Handlers not named
    take the claim's whole share."""
    limited = limited_handlers()
    if limited:
        # A limited handler's row exists before its first claim (it holds its tokens, a full
        # burst to start with): an INSERT … ON CONFLICT DO NOTHING, which writes nothing once
        # it does.
        HandlerPace.objects.bulk_create(
            [
                HandlerPace(
                    handler=name,
                    tokens=limits.burst(limits.rate) if limits.rate is not None else 0.0,
                    refilled_at=now,
                )
                for name, limits in sorted(limited.items())
            ],
            ignore_conflicts=True,
        )
    with connection.cursor() as cursor:
        cursor.execute(_sql(LOCK_PACES), {"limited": sorted(limited), "now": now})
        rows = {row[0]: PaceRow(*row) for row in cursor.fetchall()}
        counted = [name for name in rows if (limit_ := limited.get(name)) and limit_.concurrency]
        in_flight: dict[str, int] = {}
        if counted:
            cursor.execute(_sql(IN_FLIGHT), {"handlers": counted})
            in_flight = dict(cursor.fetchall())
    shares: dict[str, int] = {}
    for name, row in rows.items():
        limits = limited.get(name, HandlerLimits())
        row.refill(limits, now)
        share = limit
        if row.not_before is not None and now < row.not_before:
            share = 0
        if limits.rate is not None:
            share = min(share, math.floor(row.tokens))
        if limits.concurrency is not None:
            # One a claim: a worker runs its batch one delivery after another, so a second
            # would hold a slot of the concurrency without running. The concurrency is then
            # the workers that run the handler at once.
            share = min(share, 1, limits.concurrency - in_flight.get(name, 0))
        shares[name] = max(0, share)
    return Paces(rows=rows, shares=shares)


def handler_slow_down(*, handler: str, failure: Failure, now: datetime) -> None:
    """A downstream answered the handler with a 429 or a Retry-After: no claim of it before
    the pause asked for (else HANDLER_RATE_LIMITED_PAUSE_SECONDS), and its rate halved for
    HANDLER_SLOWDOWN_SECONDS. Says nothing about the row, which is released uncharged."""
    pause = failure.retry_after or settings.HANDLER_RATE_LIMITED_PAUSE_SECONDS
    pause = min(pause, settings.DELIVERY_BACKOFF_CAP_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(
            _sql(SLOW),
            {
                "handler": handler,
                "not_before": now + timedelta(seconds=pause),
                "until": now + timedelta(seconds=pause + settings.HANDLER_SLOWDOWN_SECONDS),
            },
        )
    logger.warning(
        "ingress.deliver.downstream_slow_down",
        extra={"handler": handler, "pause_seconds": pause, "error": failure.error_class},
    )


def slows_down(failure: Failure) -> bool:
    """A downstream's answer about its own load: a 429, or any service failure that asked for
    a pause (Retry-After)."""
    return failure.service_failure and (
        failure.retry_after is not None or failure.error_class.endswith("rate_limited")
    )
