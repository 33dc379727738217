"""The kernel's tables: the holders of the one queue's claims (kernel/queue.py)."""

from django.db import models


class ClaimHolder(models.Model):
    """A process that claims rows, and its last heartbeat (kernel/queue.py). Not replicated:
    each region knows its own; another region's holders are gone by their id."""

    id = models.BigIntegerField(primary_key=True)
    kind = models.CharField(max_length=32, blank=True, default="")
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField()

    class Meta:
        db_table = "claim_holders"
        indexes = [models.Index(fields=["beat_at"], name="claim_holder_beat")]

    def __str__(self) -> str:
        return f"holder {self.id} ({self.kind or 'process'} {self.pid} on {self.host})"
