"""The one base class every domain error in this project derives from.

Messages are module-level constants next to each error so tests assert on them instead of
on free text.
"""


class EventDropError(Exception):
    """Base class of all domain errors (ingress, recaps, outbox)."""
