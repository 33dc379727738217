"""The handlers bench/inbox_throughput.py delivers to (registered only under
bench/settings_inbox.py, which installs the `bench` app).

Each does what a real handler does, one small write in its delivery's transaction, and the
write counts: every call appends one "h" to the event's `query_string` (a column nothing
reads after the receive path), so the benchmark can prove afterwards that each delivered
event's handlers committed exactly once each and a duplicate's never. How many are
registered is the bench's `--handlers` (EVENTDROP_BENCH_HANDLERS, default 1; 0 measures
verify and dedup alone).
"""

import os

from django.db.models import F, Value
from django.db.models.functions import Concat

from ingress.handlers import webhook_handler
from ingress.models import RawEvent

BENCH_EVENT_TYPE = "payment_intent.succeeded"


def count_bench_delivery(event: RawEvent, payload: dict) -> None:
    RawEvent.objects.filter(pk=event.pk, received_at=event.received_at).update(
        query_string=Concat(F("query_string"), Value("h"))
    )


for number in range(int(os.environ.get("EVENTDROP_BENCH_HANDLERS", "1"))):
    # Distinct functions (the registry names a handler by its qualified name).
    def handler(event: RawEvent, payload: dict) -> None:
        count_bench_delivery(event, payload)

    handler.__qualname__ = f"count_bench_delivery_{number}"
    webhook_handler(provider="stripe", event_types=[BENCH_EVENT_TYPE])(handler)
