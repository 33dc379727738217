"""Whether this process may process now: the one question the inbox and the dispatcher ask
before every pass (docs/multi-region.md, "Processing in exactly one place").

With one region the answer is always yes. With several, the regions app installs its gate
at start-up (regions/apps.py): the gate lives above the apps that ask, in the layers
(pyproject.toml [tool.importlinter]), since it reads their tables, so they reach it through
this seam instead of importing it.
"""

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager


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
