"""The render service's circuit breaker: judged by real calls, shared in the database, off
the per-row path.

Why the database: dispatchers run in several processes on several hosts, and a breaker per
process would let each of them pay a full timeout per row during an outage before learning
what the others already know. Why not a lock per dispatch: that serialised every dispatcher
on one row (29 dispatches/s with four slots, issue 9). So:

- reads: each dispatcher run keeps an in-process view (`Breaker`) of the shared row,
  refreshed at most every RENDER_BREAKER_REFRESH_MS; a closed breaker whose service was
  seen working lately costs a dispatch nothing, not even a query;
- writes: on a transition, a service failure, and a success at most twice per cool-down
  (`last_success_at`, below), as one conditional UPDATE on the row's `version` (optimistic
  concurrency: re-read and retry when another process got there first), under a short
  lock_timeout. A write that fails (lock timeout, deadlock, a restarted database) is logged
  and dropped: the breaker is advice, it never decides a row's fate.

What it judges: the outcomes of real render calls. Only a render accepted (2xx with a
render id) proves the service works: it ends the failure streak, closes a half-open breaker
and stamps `last_success_at`. An answer about the service or its deploy (5xx, 429, 3xx,
401/403/404/405/408/409/410/425, timeouts, refused connections, health red) and an
ambiguous one (another 4xx, a 2xx without a render id) add the row to the streak; a verdict
about the row (422) says nothing about the service either way. The breaker opens

- when the streak holds RENDER_BREAKER_FAILURE_THRESHOLD *distinct rows*, or
- at the first failure when nothing has proven the service healthy within the last
  cool-down (no render accepted since `last_success_at` + cool-down): with one or two rows
  in flight, a total outage is then a breaker open after one call, not a call per row per
  backoff. So protection does not depend on traffic: a row is tried against an unproven
  service at most once per cool-down.

    closed ──N distinct rows, or one while unproven──▶ open ──cool-down over──▶ half-open
      ▲                                                 ▲                          │ one REAL
      └────────────── probe rendered ───────────────────┴──── probe failed ────────┘ dispatch

The half-open probe is one real dispatch of one row, not a health check: a health check
answers 200 while /renders answers 500, and closing on it burned every row (issue 9).

None of this charges a row: under the finality rule (kernel/retry.py) an answer about
the service is never the row's cost. The breaker only says when a waiting row may be tried
again (`record_failure` returns the end of the cool-down while it is open).
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone

from kernel.budgets import render_dispatch_worst_case
from outbox.models import BreakerState, CircuitBreaker
from outbox.render_client import RenderClientConfig

logger = logging.getLogger(__name__)

RENDER_SERVICE_BREAKER = "render-service"
# Optimistic writes that lose the race re-read and try again; beyond this, the breaker
# gives up on recording (and says so) rather than keep a dispatch waiting.
_WRITE_TRIES = 50


@dataclass(frozen=True)
class BreakerConfig:
    failure_threshold: int
    cooldown: timedelta
    # A half-open probe not heard from in this long died with its worker.
    probe_timeout: timedelta
    # How old the in-process view may get before it is read again.
    refresh_seconds: float = 0.5
    # The longest a breaker write waits for the row's lock (PostgreSQL lock_timeout).
    lock_timeout_ms: int = 200

    @classmethod
    def from_settings(cls) -> "BreakerConfig":
        return cls(
            failure_threshold=settings.RENDER_BREAKER_FAILURE_THRESHOLD,
            cooldown=timedelta(seconds=settings.RENDER_BREAKER_COOLDOWN_SECONDS),
            probe_timeout=timedelta(
                seconds=render_dispatch_worst_case(RenderClientConfig.from_settings()).seconds
            ),
            refresh_seconds=settings.RENDER_BREAKER_REFRESH_MS / 1000,
            lock_timeout_ms=settings.RENDER_BREAKER_LOCK_TIMEOUT_MS,
        )


@dataclass(frozen=True)
class Snapshot:
    """The shared row as last read (a missing row is a closed breaker never proven)."""

    state: str = BreakerState.CLOSED
    consecutive_failures: int = 0
    # The side effects whose failures form the current streak (distinct ids).
    failing_rows: tuple[int, ...] = ()
    opened_at: datetime | None = None
    open_until: datetime | None = None
    probe_started_at: datetime | None = None
    last_success_at: datetime | None = None
    version: int = 0
    exists: bool = False

    @classmethod
    def of(cls, row: CircuitBreaker | None) -> "Snapshot":
        if row is None:
            return cls()
        return cls(
            state=row.state,
            consecutive_failures=row.consecutive_failures,
            failing_rows=tuple(int(row_id) for row_id in row.failing_rows or ()),
            opened_at=row.opened_at,
            open_until=row.open_until,
            probe_started_at=row.probe_started_at,
            last_success_at=row.last_success_at,
            version=row.version,
            exists=True,
        )

    @property
    def clean(self) -> bool:
        return self.state == BreakerState.CLOSED and self.consecutive_failures == 0

    def proven_at(self, now: datetime, cooldown: timedelta) -> bool:
        """Did a render accepted within the last cool-down prove the service healthy?"""
        return self.last_success_at is not None and now - self.last_success_at <= cooldown


@dataclass(frozen=True)
class Admission:
    allowed: bool
    probe: bool = False
    # When asking again makes sense (a denied row's next_attempt_at).
    retry_at: datetime | None = None


class Breaker:
    """A dispatcher run's view of one shared breaker. Thread-safe (the bulkhead's threads
    share it); every method is safe to call with the database down."""

    def __init__(
        self,
        *,
        name: str = RENDER_SERVICE_BREAKER,
        config: BreakerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.name = name
        self.config = config or BreakerConfig.from_settings()
        self._clock = clock
        self._lock = threading.Lock()
        self._snapshot = Snapshot()
        self._read_at: float | None = None
        self._probing = False  # this view holds the half-open probe
        # A write that could not get the row (lock timeout, database down) is not retried
        # by every following success: that would stall each dispatch by the lock timeout.
        self._writes_blocked_until: float | None = None

    # --- reads -------------------------------------------------------------------------------

    def view(self, *, fresh: bool = False) -> Snapshot:
        with self._lock:
            age = None if self._read_at is None else self._clock() - self._read_at
            if not fresh and age is not None and age < self.config.refresh_seconds:
                return self._snapshot
        try:
            snapshot = Snapshot.of(CircuitBreaker.objects.filter(name=self.name).first())
        except DatabaseError:
            logger.warning("outbox.breaker.read_failed", extra={"breaker": self.name})
            connection.close_if_unusable_or_obsolete()
            with self._lock:
                return self._snapshot
        with self._lock:
            self._snapshot, self._read_at = snapshot, self._clock()
        return snapshot

    def _probe_deadline(self, snapshot: Snapshot) -> datetime | None:
        if snapshot.probe_started_at is None:
            return None  # half-open without a probe start: nothing to wait for
        return snapshot.probe_started_at + self.config.probe_timeout

    def _waiting_until(self, snapshot: Snapshot, now: datetime) -> datetime | None:
        """When calls may go again, or None if a probe may be taken now."""
        if snapshot.state == BreakerState.OPEN and snapshot.open_until is not None:
            return snapshot.open_until if now < snapshot.open_until else None
        probe_deadline = self._probe_deadline(snapshot)
        if snapshot.state == BreakerState.HALF_OPEN and probe_deadline is not None:
            return probe_deadline if now < probe_deadline else None
        return None

    def claim_limit(self, free: int, *, now: datetime) -> int:
        """How many rows a dispatcher should claim now: all free slots when closed, one
        (the probe) when a probe may be taken, else none."""
        snapshot = self.view()
        if snapshot.state == BreakerState.CLOSED:
            return free
        with self._lock:
            if self._probing:
                return 0
        return 0 if self._waiting_until(snapshot, now) else min(free, 1)

    def admit(self, *, now: datetime) -> Admission:
        """May this row's render call go out now? Half-open lets exactly one through."""
        snapshot = self.view()
        if snapshot.state == BreakerState.CLOSED:
            return Admission(allowed=True)
        until = self._waiting_until(snapshot, now)
        if until is None and self._take_probe(snapshot, now):
            return Admission(allowed=True, probe=True)
        if until is None:
            snapshot = self.view(fresh=True)
            until = self._waiting_until(snapshot, now) or now + self.config.probe_timeout
        return Admission(allowed=False, retry_at=until)

    # --- writes ------------------------------------------------------------------------------

    def _write(self, snapshot: Snapshot, now: datetime, **fields) -> bool:
        """One conditional UPDATE, fenced on the version read; True if it was ours."""
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = {int(self.config.lock_timeout_ms)}")
            updated = CircuitBreaker.objects.filter(
                name=self.name, version=snapshot.version
            ).update(version=F("version") + 1, updated_at=now, **fields)
        if updated:
            known = {k: v for k, v in fields.items() if k in Snapshot.__dataclass_fields__}
            if "failing_rows" in known:
                known["failing_rows"] = tuple(known["failing_rows"])
            with self._lock:
                self._snapshot = replace(snapshot, version=snapshot.version + 1, **known)
                self._read_at = self._clock()
        return bool(updated)

    def _take_probe(self, snapshot: Snapshot, now: datetime) -> bool:
        with self._lock:
            if self._probing:
                return False
            self._probing = True
        try:
            taken = self._write(snapshot, now, state=BreakerState.HALF_OPEN, probe_started_at=now)
        except DatabaseError:
            self._write_failed()
            taken = False
        if taken:
            logger.info("outbox.breaker.half_open", extra={"breaker": self.name})
        else:
            with self._lock:
                self._probing = False
        return taken

    def _write_failed(self) -> None:
        logger.warning("outbox.breaker.write_failed", extra={"breaker": self.name})
        connection.close_if_unusable_or_obsolete()
        with self._lock:
            self._writes_blocked_until = self._clock() + max(self.config.refresh_seconds, 0.1)

    def _end_probe(self, probe: bool) -> None:
        if probe:
            with self._lock:
                self._probing = False

    def abandon_probe(self) -> None:
        """The probe row never made its call: let another row probe after the timeout."""
        self._end_probe(True)

    def record_success(self, *, probe: bool, now: datetime | None = None) -> None:
        """A render was accepted: the streak ends, an open breaker closes, and the service
        counts as proven healthy for the next cool-down. Written only when something
        changes or `last_success_at` is half a cool-down old, so a busy dispatcher pays
        for it about twice per cool-down, not once per render."""
        now = now or timezone.now()
        self._end_probe(probe)
        snapshot = self.view()
        if snapshot.clean and not probe and snapshot.proven_at(now, self.config.cooldown / 2):
            return  # the hot path: nothing to write
        blocked = self._writes_blocked_until
        if not probe and blocked is not None and self._clock() < blocked:
            return  # the last write could not get the row; the streak ends next time
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL lock_timeout = {int(self.config.lock_timeout_ms)}")
                if not snapshot.exists:
                    CircuitBreaker.objects.bulk_create(
                        [CircuitBreaker(name=self.name)], ignore_conflicts=True
                    )
                CircuitBreaker.objects.filter(name=self.name).update(
                    state=BreakerState.CLOSED,
                    consecutive_failures=0,
                    failing_rows=[],
                    opened_at=None,
                    open_until=None,
                    probe_started_at=None,
                    last_success_at=now,
                    version=F("version") + 1,
                    updated_at=now,
                )
        except DatabaseError:
            self._write_failed()
            return
        with self._lock:
            self._read_at = None  # read the new version next time
        if snapshot.state != BreakerState.CLOSED:
            logger.info("outbox.breaker.closed", extra={"breaker": self.name})

    def record_failure(
        self,
        *,
        side_effect_id: int,
        error_class: str,
        probe: bool,
        now: datetime | None = None,
    ) -> datetime | None:
        """A real call failed, or answered, in a way that does not prove the service works.
        Returns when the row may be tried again if the breaker is (now) open or half-open,
        None when it stays closed (the caller's own backoff applies). Whatever happens
        here, the row is not charged: that is the finality rule, not the breaker's call."""
        now = now or timezone.now()
        self._end_probe(probe)
        try:
            for _ in range(_WRITE_TRIES):
                folded = self._fold_failure(side_effect_id, error_class, probe, now)
                if folded is not None:
                    return folded[0]
            logger.warning("outbox.breaker.contended", extra={"breaker": self.name})
        except DatabaseError:
            self._write_failed()
        # We could not record it: wait as long as what we last saw says.
        return self._waiting_until(self._snapshot, now)

    def _fold_failure(
        self, side_effect_id: int, error_class: str, probe: bool, now: datetime
    ) -> tuple[datetime | None] | None:
        """One optimistic try: (retry at,), or None when another process changed the row
        meanwhile."""
        snapshot = self.view(fresh=True)
        if not snapshot.exists:
            CircuitBreaker.objects.bulk_create(
                [CircuitBreaker(name=self.name)], ignore_conflicts=True
            )
            return None
        open_until = now + self.config.cooldown
        reopen = {
            "state": BreakerState.OPEN,
            "open_until": open_until,
            "probe_started_at": None,
            "last_error_class": error_class[:64],
        }
        if probe:
            # The probe failed: the service still fails. Open for another cool-down.
            if not self._write(snapshot, now, opened_at=snapshot.opened_at or now, **reopen):
                return None
            logger.warning("outbox.breaker.probe_failed", extra={"breaker": self.name})
            return (open_until,)
        if snapshot.state != BreakerState.CLOSED:
            # A call let through before the breaker opened: it waits for the probe.
            return (self._waiting_until(snapshot, now) or now + self.config.probe_timeout,)
        streak = sorted({*snapshot.failing_rows, side_effect_id})
        failures = snapshot.consecutive_failures + 1
        unproven = not snapshot.proven_at(now, self.config.cooldown)
        if len(streak) < self.config.failure_threshold and not unproven:
            if not self._write(
                snapshot,
                now,
                consecutive_failures=failures,
                failing_rows=streak,
                last_error_class=error_class[:64],
            ):
                return None
            return (None,)
        if not self._write(
            snapshot, now, consecutive_failures=failures, failing_rows=[], opened_at=now, **reopen
        ):
            return None
        logger.warning(
            "outbox.breaker.open",
            extra={
                "breaker": self.name,
                "rows": len(streak),
                "unproven": unproven,
                "error_class": error_class,
            },
        )
        return (open_until,)
