"""The handlers bench/inbox_throughput.py delivers to (registered only under
bench/settings_inbox.py, which installs the `bench` app).

Each does what a real handler does, one small write of its own in its delivery's
transaction: a HandlerRun row (bench/models.py), as the recap handlers write their business
rows. The rows count: the benchmark proves afterwards that each delivered event's handlers
committed exactly once each and a duplicate's never. How many are registered is the bench's
`--handlers` (EVENTDROP_BENCH_HANDLERS, default 1; 0 measures verify and dedup alone).

The write is one statement on the delivery's connection, as a handler on a hot path would
issue it. Until issue 15's last measurements the handler instead rewrote the raw event's
row through the ORM (`filter(...).update(query_string=Concat(...))`): compiling that UPDATE
in the worker and rewriting the whole raw event row with its index entries in PostgreSQL
cost more than everything the pipeline does per event, so the drain measured those rather
than verify, dedup and deliver (the history of docs/benchmarks.md in git). `--baseline` runs
this handler with the other revision's pipeline.
"""

import os

from django.db import connection

from bench.models import HandlerRun
from ingress.handlers import webhook_handler
from ingress.models import RawEvent

BENCH_EVENT_TYPE = "payment_intent.succeeded"

_RECORD = (
    f"INSERT INTO {connection.ops.quote_name(HandlerRun._meta.db_table)}"  # noqa: S608 (a name)
    " (raw_event_id, handler) VALUES (%s, %s)"
)


def record_handler_run(event: RawEvent, handler: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_RECORD, [event.pk, handler])


for number in range(int(os.environ.get("EVENTDROP_BENCH_HANDLERS", "1"))):
    name = f"count_bench_delivery_{number}"

    # Distinct functions (the registry names a handler by its qualified name).
    def handler(event: RawEvent, payload: dict, name: str = name) -> None:
        record_handler_run(event, name)

    handler.__qualname__ = name
    webhook_handler(provider="stripe", event_types=[BENCH_EVENT_TYPE])(handler)
