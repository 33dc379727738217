"""The layers import one way (issue 10, docs/architecture.md): no cycle between apps and no
import that points up. The graph is read from the source by scripts/import_graph.py."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_cycle_and_no_import_points_up():
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "import_graph.py")],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no import points up" in run.stdout, run.stdout
