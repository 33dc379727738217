"""The two questions asked of the regions: may this process run a pass now
(`processing_pass`), and may this region write processing state (`require_processing_region`).
With one region both say yes; with several, regions/apps.py installs the answers here, since
regions sits above the apps that ask (docs/architecture.md, "The layers"; the rules:
docs/multi-region.md).
"""

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from kernel.errors import EventDropError


@contextlib.contextmanager
def _always() -> Iterator[bool]:
    yield True


_gate: Callable[[], AbstractContextManager[bool]] = _always


def install_processing_gate(gate: Callable[[], AbstractContextManager[bool]]) -> None:
    global _gate
    _gate = gate


def processing_pass() -> AbstractContextManager[bool]:
    """`with processing_pass() as here:` — run the pass only if `here`; held for the pass."""
    return _gate()


# --- writes of processing state outside a pass -------------------------------------------------

STANDBY_REGION = (
    "Region {region!r} is the standby: processing state (replays, re-arms, pauses, bulk jobs, "
    "recaps, reconciliation) is written only in the processing region, {processing_region!r} "
    "(epoch {epoch}). Do this in {processing_region!r}'s console or API, or switch the "
    "processing region first."
)
PROCESSING_NOT_STARTED = (
    "Region {region!r} is named the processing region (epoch {epoch}) but has not started "
    "processing yet: the previous region has not handed over, or no inbox pass has run here "
    "since. Retry in a few seconds."
)
NO_PROCESSING_DECISION = (
    "Region {region!r} has no processing decision yet: run `manage.py region_setup "
    "--processing-region NAME`, then retry."
)


class ProcessingWritesRefused(EventDropError):
    """This region may not write processing state now; nothing was written.

    `status` and `code` are the API's answer (kernel/problems.py); `retry_after`, set, says
    the refusal ends by itself (a switch under way) and the answer is a 503 with Retry-After.
    """

    status = 409
    code = "standby_region"
    retry_after: int | None = None

    def __init__(self, message: str, *, region: str, processing_region: str, epoch: int):
        super().__init__(message)
        self.region = region
        self.processing_region = processing_region
        self.epoch = epoch


class StandbyRegion(ProcessingWritesRefused):
    """The effective decision names another region: go there (409, until an operator switch)."""


class ProcessingNotStarted(ProcessingWritesRefused):
    """Named the processing region, but not started yet (503: it ends by itself)."""

    status = 503
    code = "processing_not_started"

    def __init__(
        self,
        message: str,
        *,
        region: str,
        processing_region: str,
        epoch: int,
        retry_after: int,
    ):
        super().__init__(message, region=region, processing_region=processing_region, epoch=epoch)
        self.retry_after = retry_after


def _anywhere() -> None:
    return None


_writes_guard: Callable[[], None] = _anywhere


def install_processing_writes_guard(guard: Callable[[], None]) -> None:
    global _writes_guard
    _writes_guard = guard


def require_processing_region() -> None:
    """Raise ProcessingWritesRefused unless this region may write processing state now.

    Asked once, before anything is written or recorded, by each service an operator, a buyer
    or a command reaches that writes processing state. Reads never ask."""
    _writes_guard()
