"""ACK latency per source and hour in the database, for the ops page's 24 h chart.

The receive path's histogram (ingress.views.ACK_SECONDS) lives in each web process's memory
and only ever grows. Every web process runs one `AckRollupFlusher` thread (eventdrop/asgi.py)
that, every ACK_ROLLUP_FLUSH_SECONDS, takes what the histogram counted since the last look
(the delta of each bucket, per source) and adds it to that source's row of the current
clock hour in console.AckLatencyHour with one INSERT … ON CONFLICT DO UPDATE per row that
*adds* — so the rows of many processes and hosts sum up, and no process needs to know of
another.

- Never on the request path: observing stays a few additions in memory (the view); the
  flush runs on a thread of its own, one flush at a time, its database waits bounded by
  FLUSH_DEADLINE_SECONDS (kernel.db.database_deadline; 5 s, which leaves a new
  connection libpq's 2 s minimum connect timeout).
- A failed flush loses nothing: its deltas stay pending and are added to the next flush.
  Pending rows are bounded: one per (source, hour) of the last RETENTION, older ones are
  dropped (their rows would be pruned anyway). One log line per kind of failure (the
  exception's class, no payload) until a flush succeeds again, which says so once.
- Rows older than RETENTION (48 h) are deleted by the flusher, at most once an hour.
- The hour is the flush's: up to one interval of ACKs at the end of an hour counts in the
  next one.
"""

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from console.models import ACK_ROLLUP_BUCKETS, AckLatencyHour
from kernel.db import database_deadline

logger = logging.getLogger(__name__)

RETENTION = timedelta(hours=48)
PRUNE_EVERY = timedelta(hours=1)
# Every database wait of one flush (connect, upserts, prune, commit) ends within this.
FLUSH_DEADLINE_SECONDS = 5.0
BOUNDS = tuple(bound for bound, _ in ACK_ROLLUP_BUCKETS)
COLUMNS = tuple(column for _, column in ACK_ROLLUP_BUCKETS)


def _clock_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def histogram_bucket_counts(histogram) -> dict[str, list[int]]:
    """Per source, the ACKs counted so far in each bucket (not cumulative), in BOUNDS order.

    Read from the histogram object itself: in prometheus_client's multiprocess mode too it
    answers for this process only (its own file), which is what the deltas must be of."""
    per_source: dict[str, dict[float, float]] = {}
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                cumulative = per_source.setdefault(sample.labels["source"], {})
                cumulative[float(sample.labels["le"])] = sample.value
    counts: dict[str, list[int]] = {}
    for source, cumulative in per_source.items():
        if tuple(sorted(cumulative)) != BOUNDS:
            raise ValueError(
                "The ACK histogram's buckets differ from console.models.ACK_ROLLUP_BUCKETS."
            )
        running = [int(cumulative[bound]) for bound in BOUNDS]
        counts[source] = [running[0]] + [b - a for a, b in itertools.pairwise(running)]
    return counts


def _upsert_sql() -> str:
    quote = connection.ops.quote_name
    table = quote(AckLatencyHour._meta.db_table)
    columns = ", ".join(quote(c) for c in ("source", "hour", *COLUMNS))
    placeholders = ", ".join(["%s"] * (2 + len(COLUMNS)))
    adds = ", ".join(f"{quote(c)} = {table}.{quote(c)} + EXCLUDED.{quote(c)}" for c in COLUMNS)
    # Names from the model, values parameters.
    return (
        f"INSERT INTO {table} ({columns}) VALUES ({placeholders}) "  # noqa: S608
        f"ON CONFLICT ({quote('source')}, {quote('hour')}) DO UPDATE SET {adds}"
    )


def ack_rollup_add(rows: dict[tuple[str, datetime], list[int]]) -> None:
    """Add per-bucket counts to the (source, hour) rows, creating them as needed; one
    transaction, so a failure adds nothing and the caller may add the same rows again."""
    if not rows:
        return
    params: list[tuple[str | datetime | int, ...]] = [
        (source, hour, *counts) for (source, hour), counts in sorted(rows.items())
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(_upsert_sql(), params)


def ack_rollup_prune(*, now: datetime) -> int:
    deleted, _ = AckLatencyHour.objects.filter(hour__lt=_clock_hour(now - RETENTION)).delete()
    return deleted


class AckRollup:
    """The delta and flush arithmetic of one process (no thread: AckRollupFlusher runs it)."""

    def __init__(self, histogram, *, write: Callable = ack_rollup_add, prune=ack_rollup_prune):
        self.histogram = histogram
        self.write = write
        self.prune = prune
        # What the histogram had counted at the last look: a process's histogram starts at
        # zero, so everything it counts is added exactly once.
        self.seen: dict[str, list[int]] = {}
        # (source, hour) -> counts not yet in the database
        self.pending: dict[tuple[str, datetime], list[int]] = {}
        self.failing: set[str] = set()
        self.pruned_at: datetime | None = None

    def take(self, *, now: datetime) -> None:
        """Move what was counted since the last look into `pending`, under now's hour."""
        hour = _clock_hour(now)
        for source, counts in histogram_bucket_counts(self.histogram).items():
            before = self.seen.get(source, [0] * len(counts))
            delta = [after - was for after, was in zip(counts, before, strict=True)]
            self.seen[source] = counts
            if any(delta):
                row = self.pending.setdefault((source, hour), [0] * len(counts))
                self.pending[(source, hour)] = [a + b for a, b in zip(row, delta, strict=True)]
        oldest = _clock_hour(now - RETENTION)
        for key in [key for key in self.pending if key[1] < oldest]:
            del self.pending[key]

    def flush(
        self, *, now: datetime | None = None, deadline_seconds: float = FLUSH_DEADLINE_SECONDS
    ) -> bool:
        """take(), then add everything pending to the database; True when it is all in."""
        now = now or timezone.now()
        try:
            self.take(now=now)
            with database_deadline(deadline_seconds):
                self.write(dict(self.pending))
            self.pending.clear()  # in the database now: never added twice
            if self.pruned_at is None or now - self.pruned_at >= PRUNE_EVERY:
                with database_deadline(deadline_seconds):
                    self.prune(now=now)
                self.pruned_at = now
        except Exception as error:  # any failure: keep the deltas, retry
            kind = type(error).__name__
            if kind not in self.failing:
                self.failing.add(kind)
                logger.warning(
                    "ACK roll-up flush failed (%s); %d row(s) kept for the next flush",
                    kind,
                    len(self.pending),
                )
            return False
        if self.failing:
            logger.info(
                "ACK roll-up flush succeeded again after %s", ", ".join(sorted(self.failing))
            )
            self.failing.clear()
        return True


class AckRollupFlusher(threading.Thread):
    """A daemon thread flushing `rollup` every `interval_seconds`. What the last interval
    counted before the process exits is lost (Prometheus still has it)."""

    def __init__(self, rollup: AckRollup, *, interval_seconds: float):
        if interval_seconds <= 0:
            raise ValueError("ACK_ROLLUP_FLUSH_SECONDS must be above 0")
        super().__init__(name="ack-rollup", daemon=True)
        self.rollup = rollup
        self.interval_seconds = interval_seconds
        self.stopped = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic() + self.interval_seconds
        while not self.stopped.wait(max(0.0, next_at - time.monotonic())):
            # A flush that outlasted the interval is followed by one interval of rest, not
            # by a burst of catch-up flushes (one flush takes it all anyway).
            next_at = max(next_at + self.interval_seconds, time.monotonic())
            try:
                self.rollup.flush()  # catches and logs its own failures
            finally:
                # The thread's own connection: closed after each flush, so a broken one is
                # never reused and an idle one holds no server slot for a minute. Closing a
                # broken one may raise; that must not end the thread.
                with contextlib.suppress(Exception):
                    connection.close()

    def stop(self) -> None:
        self.stopped.set()
