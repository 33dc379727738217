"""Who processes, and what each region has seen (docs/multi-region.md, "Processing in exactly
one place"). ProcessingDecision is an insert-only log; RegionState is one row per region,
written only by that region: neither carries a change back to where it came from.
"""

from django.db import models
from django.utils import timezone


class RegionState(models.Model):
    name = models.CharField(max_length=32, primary_key=True)
    number = models.PositiveSmallIntegerField()
    # source name -> sorted sha256 hex digests of its secrets
    secret_fingerprints = models.JSONField(default=dict)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The highest decision epoch this region has seen and obeys; written only once none of
    # its passes still runs under an older one (regions/services.py).
    seen_epoch = models.BigIntegerField(default=0)
    lease_until = models.DateTimeField(null=True, blank=True)
    lease_epoch = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name


class ProcessingDecision(models.Model):
    id = models.BigAutoField(primary_key=True)
    epoch = models.BigIntegerField()
    decided_in = models.CharField(max_length=32)
    processing_region = models.CharField(max_length=32)
    # The operator declared the other region lost: this region may start at once (within a
    # lease of the decision) instead of waiting for the other's acknowledgement.
    peer_lost = models.BooleanField(default=False)
    actor_username = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    decided_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["epoch", "decided_in"], name="processingdecision_epoch_region_unique"
            )
        ]
        ordering = ["-epoch", "-decided_in"]

    def __str__(self) -> str:
        return f"epoch {self.epoch}: {self.processing_region} (decided in {self.decided_in})"
