"""The one signal recaps sends: a recap has just become paid (or was redeemed).

Why a signal: the outbox (outbox/) sits above recaps. It imports recaps' models, selectors
and services, and recaps imports nothing of the outbox. Yet a paid recap must get its render
row in the *same* transaction as its `paid` status (a crash between the two would leave a
paid recap that nobody renders until the nightly recovery). So recap_mark_paid sends
`recap_paid` inside its transaction, and the outbox's one receiver
(outbox/receivers.py, connected in OutboxConfig.ready) enqueues the render row there: the
dependency points one way, the write stays atomic. `recaps.E002` refuses to start without a
receiver, so a paid recap can never silently wait for a render nobody will request.

Arguments: `recap` (the locked RecapVideo, already saved as paid) and `now`.

`recap_payment_withdrawn` is its counterpart: a paid recap's asynchronous payment failed
before the render (recaps.services.checkout_event_apply). Sent inside that transaction, with
the recap still `paid`; the outbox's receiver deletes the render row it has not claimed yet,
or raises RecapStateConflict (the render was already requested), which rolls the whole
change back.
"""

from django.dispatch import Signal

recap_paid = Signal()
recap_payment_withdrawn = Signal()
