"""The outbox's answer to recaps' one signal (recaps/signals.py): a paid recap gets its
render row in the transaction that made it paid. Connected in OutboxConfig.ready."""

from datetime import datetime

from outbox.services import side_effect_enqueue
from recaps.models import RecapVideo


def enqueue_render_for_paid_recap(
    sender: object, *, recap: RecapVideo, now: datetime, **kwargs: object
) -> None:
    side_effect_enqueue(recap=recap, now=now)
