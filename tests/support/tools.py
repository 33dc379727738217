"""The system tools the suite runs, and what a test does when one is missing.

scripts/test-tools.txt names each tool and the Debian packages that install it, and
scripts/install-test-deps.sh (run by `make test` and CI) installs what is missing when it
runs as root. A test that needs a tool asks for it here:

    promtool = tool("promtool")   # its path

Missing, the test is skipped with the line that installs it; on CI (`CI=true`, as CI runs
.ci/run) it fails instead, since CI runs every test.
"""

import os
import shutil

import pytest

from tests.support.processes import ROOT

TABLE = ROOT / "scripts" / "test-tools.txt"


def install_line(name: str) -> str:
    """`apt-get install <the packages of name>`, from the table."""
    for line in TABLE.read_text().splitlines():
        tool, _, packages = line.partition(" ")
        if tool == name:
            return f"apt-get install {' '.join(packages.split())}"
    raise LookupError(f"{name} is not in {TABLE.relative_to(ROOT)}: add it there")


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def tool(name: str) -> str:
    """The path of `name` (a command or a path); skips the test, or fails it on CI, when it
    is missing."""
    path = shutil.which(name)
    if path is not None:
        return path
    install = install_line(name)
    if on_ci():
        pytest.fail(
            f"{name} is missing, and CI runs every test: {install} (scripts/install-test-deps.sh)",
            pytrace=False,
        )
    pytest.skip(f"{name} is missing: {install}")
