"""The outbox's answers to recaps' signals (recaps/signals.py), in the sender's transaction:
a paid recap gets its render row; a payment that failed before the render withdraws it.
Connected in OutboxConfig.ready."""

from datetime import datetime

from outbox.services import side_effect_enqueue, side_effect_withdraw
from recaps.models import RecapVideo


def enqueue_render_for_paid_recap(
    sender: object, *, recap: RecapVideo, now: datetime, **kwargs: object
) -> None:
    side_effect_enqueue(recap=recap, now=now)


def withdraw_render_for_unpaid_recap(
    sender: object, *, recap: RecapVideo, now: datetime, **kwargs: object
) -> None:
    side_effect_withdraw(recap=recap)
