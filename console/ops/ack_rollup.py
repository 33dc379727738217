"""ACK latency per source and hour in the database, for the ops page's 24 h chart.

The receive path's histogram (ingress.receive.ACK_SECONDS) lives in each web process's memory,
or, in prometheus_client's multiprocess mode, in one file per worker that any of them merges.
Whoever reads it for /metrics or /ops/ (console.ops.ack_latency_collectors, the same reading
as the running ACK p99 figure) also rolls it up, so no process keeps a thread for it:
`ack_rollup_collect` adds to the current hour's row of each source (console.AckLatencyHour)
what the histogram counted since the last collection of the same histogram, in one
transaction that locks that histogram's mark (console.AckRollupMark: what it had counted
then). Two scrapes at once take turns; a failed one adds nothing and loses nothing, the next
adds it. A histogram is named by host and run (the multiprocess directory, emptied at every
start, or the process), so a restart starts a new mark instead of a negative delta.

The hour is the collection's: ACKs counted before the hour turned count in the next hour when
nobody read the histogram in between (Prometheus scrapes every 15-60 s). Rows and marks older
than RETENTION are pruned by the console's minute sweep.
"""

import itertools
import json
import os
import socket
import time
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from console.models import ACK_ROLLUP_BUCKETS, AckLatencyHour, AckRollupMark

RETENTION = timedelta(hours=48)
BOUNDS = tuple(bound for bound, _ in ACK_ROLLUP_BUCKETS)
COLUMNS = tuple(column for _, column in ACK_ROLLUP_BUCKETS)
PROCESS_STARTED_NS = time.time_ns()


def _clock_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def histogram_bucket_counts(*collectors) -> dict[str, list[int]]:
    """Per source, the ACKs counted so far in each bucket (not cumulative), in BOUNDS order,
    summed over the collectors (a histogram, or the multiprocess collector). A histogram
    whose buckets are not ACK_ROLLUP_BUCKETS is not the receive path's: left out."""
    per_source: dict[str, dict[float, float]] = {}
    for collector in collectors:
        for family in collector.collect():
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    cumulative = per_source.setdefault(sample.labels["source"], {})
                    bound = float(sample.labels["le"])
                    cumulative[bound] = cumulative.get(bound, 0) + sample.value
    counts: dict[str, list[int]] = {}
    for source, cumulative in per_source.items():
        if tuple(sorted(cumulative)) == BOUNDS:
            running = [int(cumulative[bound]) for bound in BOUNDS]
            counts[source] = [running[0]] + [b - a for a, b in itertools.pairwise(running)]
    return counts


def histogram_key() -> str:
    """This host's histogram, for the run it belongs to."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        made = os.stat(directory)
        return f"{socket.gethostname()}:{directory}:{made.st_ino}:{made.st_ctime_ns}"
    return f"{socket.gethostname()}:pid {os.getpid()}:{PROCESS_STARTED_NS}"


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
    """Add per-bucket counts to the (source, hour) rows, creating them as needed."""
    if not rows:
        return
    params: list[tuple[str | datetime | int, ...]] = [
        (source, hour, *counts) for (source, hour), counts in sorted(rows.items())
    ]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(_upsert_sql(), params)


# What this process last found rolled up, per histogram: unchanged since, nothing to do.
_confirmed: dict[str, dict[str, list[int]]] = {}


def ack_rollup_collect(*collectors, now: datetime | None = None, key: str = "") -> int:
    """Add what `collectors` counted since this histogram's last collection to the current
    hour; returns how many (source, hour) rows it added to."""
    key = key or histogram_key()
    if histogram_bucket_counts(*collectors) == _confirmed.get(key, {}):
        return 0
    return _collect(collectors, now=now, key=key)


@transaction.atomic
def _collect(collectors: tuple, *, now: datetime | None, key: str) -> int:
    now = now or timezone.now()
    hour = _clock_hour(now)
    mark = AckRollupMark.objects.select_for_update().filter(key=key).first()
    if mark is None:
        AckRollupMark.objects.bulk_create([AckRollupMark(key=key)], ignore_conflicts=True)
        mark = AckRollupMark.objects.select_for_update().get(key=key)
    # Read under the lock: a reading taken before it could be older than the mark.
    counts = histogram_bucket_counts(*collectors)
    rows = {}
    for source, total in counts.items():
        seen = mark.counts.get(source, [0] * len(total))
        delta = [after - before for after, before in zip(total, seen, strict=True)]
        if any(change < 0 for change in delta):  # not the histogram the mark saw: a new one
            delta = total
        if any(delta):
            rows[(source, hour)] = delta
    # Touched at least hourly while its histogram is read: the sweep prunes forgotten ones.
    if rows or now - mark.updated_at > timedelta(hours=1):
        _write(rows, key=key, counts=counts, now=now)
    transaction.on_commit(lambda: _confirmed.__setitem__(key, counts))
    return len(rows)


def _write(rows: dict, *, key: str, counts: dict, now: datetime) -> None:
    """The rows added to and the mark moved on, in one statement."""
    quote = connection.ops.quote_name
    mark = quote(AckRollupMark._meta.db_table)
    params: list = [json.dumps(counts), now, key]
    sql = f"UPDATE {mark} SET counts = %s::jsonb, updated_at = %s WHERE key = %s"  # noqa: S608
    if rows:
        values = ", ".join(["(" + ", ".join(["%s"] * (2 + len(COLUMNS))) + ")"] * len(rows))
        sql = f"WITH moved AS ({sql}) " + _upsert_sql().replace(
            "VALUES (" + ", ".join(["%s"] * (2 + len(COLUMNS))) + ")", f"VALUES {values}"
        )
        for (source, hour), delta in sorted(rows.items()):
            params += [source, hour, *delta]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def ack_rollup_prune(*, now: datetime) -> int:
    """Rows and marks older than RETENTION (the console's minute sweep)."""
    before = _clock_hour(now - RETENTION)
    deleted, _ = AckLatencyHour.objects.filter(hour__lt=before).delete()
    AckRollupMark.objects.filter(updated_at__lt=before).delete()
    return deleted
