"""What recaps tells the outbox, which sits above it (docs/architecture.md, "The layers"). Both
are sent inside the recap's transaction, with `recap` (locked, still or already `paid`) and
`now`, so the render row is written or withdrawn atomically with the status.
"""

from django.dispatch import Signal

# The outbox's receiver writes the render row; recaps.E002 refuses to start without one.
recap_paid = Signal()
# The receiver deletes the render row no dispatcher has claimed, or raises RecapStateConflict
# (the render was already requested), which rolls the payment's failure back.
recap_payment_withdrawn = Signal()
