"""Errors of operator actions on the outbox.

Which failures of a dispatch earn another attempt is not decided here: the one
classification table for deliveries and side effects alike is `eventdrop.retry.classify`
(docs/outbox.md, "The error contract").
"""

from eventdrop.errors import EventDropError

SIDE_EFFECT_IN_FLIGHT = (
    "Side effect #{id} is being dispatched right now; it can be re-armed once it has been "
    "processing for longer than {stale} s (its worker died)."
)
SIDE_EFFECT_ALREADY_DONE = "Side effect #{id} is done; retry the recap's render instead."
SIDE_EFFECT_ALREADY_DEAD = "Side effect #{id} is already dead."
SIDE_EFFECT_REASON_REQUIRED = "Give a reason: it is kept as the recap's failure reason."


class OutboxError(EventDropError):
    """An operator action on the outbox that cannot be done (refused, nothing changed)."""
