"""The processing region, switched by an operator (docs/multi-region.md): one audited
one-object action, recorded as every pause and incident change is
(console.services.operator_action_one), over regions.services.processing_region_set."""

from django.contrib.auth.models import User

from console.models import OperatorAction, OperatorActionKind
from console.services import NOTE_REQUIRED, OperatorActionError, operator_action_one
from regions.models import ProcessingDecision
from regions.services import processing_region_set

SWITCHED = "Processing region: {region} from epoch {epoch}{lost}."


def processing_region_switch(
    *, actor: User, via: str, region: str, reason: str, peer_lost: bool = False
) -> OperatorAction:
    """Name the processing region, saying why. `peer_lost`: the other region is declared lost
    and this one takes over (refused while the lost region's lease still runs)."""
    reason = reason.strip()
    if not reason:
        raise OperatorActionError(NOTE_REQUIRED)

    def change() -> tuple[int, str, dict]:
        decision = processing_region_set(
            region=region, peer_lost=peer_lost, actor=actor, reason=reason
        )
        lost = ", the other region declared lost" if peer_lost else ""
        detail = SWITCHED.format(region=region, epoch=decision.epoch, lost=lost)
        return decision.id, detail, {"epoch": decision.epoch, "region": region}

    return operator_action_one(
        actor=actor,
        via=via,
        action=OperatorActionKind.PROCESSING_REGION,
        target_model=ProcessingDecision._meta.label_lower,
        note=reason,
        change=change,
    )
