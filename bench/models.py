"""The table the benchmark's handler writes (bench/handlers.py), installed only with the
`bench` app under bench/settings_inbox.py."""

from django.db import models


class HandlerRun(models.Model):
    """One row per handler call, committed with its delivery: a webhook handler's own
    business row, as the recap handlers write theirs. bench/inbox_throughput.py counts them
    per event and handler to prove that every delivered event's handlers ran exactly once
    and a duplicate's never."""

    raw_event_id = models.BigIntegerField()
    handler = models.CharField(max_length=100)

    def __str__(self) -> str:
        return f"{self.handler} on raw event {self.raw_event_id}"
