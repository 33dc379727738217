"""The handlers bench/inbox_throughput.py delivers to (registered only under
bench/settings_inbox.py, which installs the `bench` app).

Each does what a real handler does, one small write in its delivery's transaction, and the
write counts: every call appends one "h" to the event's `query_string` (a column nothing
reads after the receive path), so the benchmark can prove afterwards that each delivered
event's handlers committed exactly once each and a duplicate's never. How many are
registered is the bench's `--handlers` (EVENTDROP_BENCH_HANDLERS, default 1; 0 measures
verify and dedup alone).

The write is one statement on the delivery's connection, as a handler on a hot path would
issue it. Until issue 15's last measurements it was the same UPDATE built by the ORM
(`filter(...).update(query_string=Concat(...))`): compiling it cost the worker 0.6-0.8 ms
of CPU per call, about four times everything the pipeline does per event, so the drain
measured the ORM's query compiler rather than verify, dedup and deliver
(docs/benchmarks.md, "The drain's handler"). `--baseline` with an earlier revision runs
that handler again.
"""

import os

from django.db import connection

from ingress.handlers import webhook_handler
from ingress.models import RawEvent

BENCH_EVENT_TYPE = "payment_intent.succeeded"

_MARK = (
    f"UPDATE {connection.ops.quote_name(RawEvent._meta.db_table)}"  # noqa: S608 (a name)
    " SET query_string = query_string || 'h' WHERE id = %s AND received_at = %s"
)


def count_bench_delivery(event: RawEvent, payload: dict) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_MARK, [event.pk, event.received_at])
        if cursor.rowcount != 1:
            raise RuntimeError(f"raw event {event.pk} was not marked")


for number in range(int(os.environ.get("EVENTDROP_BENCH_HANDLERS", "1"))):
    # Distinct functions (the registry names a handler by its qualified name).
    def handler(event: RawEvent, payload: dict) -> None:
        count_bench_delivery(event, payload)

    handler.__qualname__ = f"count_bench_delivery_{number}"
    webhook_handler(provider="stripe", event_types=[BENCH_EVENT_TYPE])(handler)
