"""The layers import one way (docs/architecture.md, "The layers"): import-linter's contracts
in pyproject.toml ([tool.importlinter]) hold for the tree, and each one fails on the import it
forbids, shown on a copy of the tree with that one import added."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
# Every package the contracts read, as pyproject.toml names them.
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "root_packages"
]


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_the_tree_keeps_every_contract():
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout, run.stdout


# (the module that gains an import, the import, the contract that must name it)
UPWARD_IMPORTS = [
    ("kernel/errors.py", "import ingress.models", "The layers"),
    ("ingress/models.py", "import recaps.models", "The layers"),
    ("recaps/services.py", "import outbox.services", "The layers"),
    ("outbox/services.py", "import console.models", "The layers"),
    ("console/ops/views.py", "import eventdrop.urls", "The layers"),
    ("console/ops/views.py", "import fakes.demo", "No production code imports the local fakes"),
    ("eventdrop/urls.py", "import fakes.renderer", "No production code imports the local fakes"),
    ("ingress/verifiers/github.py", "import ingress.sources", "Sources build on the provider"),
    ("ingress/providers.py", "import ingress.sources", "Sources build on the provider"),
    ("ingress/verifiers/slack.py", "import ingress.verifiers.stripe", "verifier stands alone"),
]


@pytest.mark.slow  # starts a process (tests/conftest.py)
@pytest.mark.parametrize(("module", "statement", "contract"), UPWARD_IMPORTS)
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, statement, contract):
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    # Inside a function, where nothing runs it: import-linter reads imports at any depth.
    target.write_text(target.read_text() + f"\n\ndef _injected() -> None:\n    {statement}\n")

    run = lint_imports(tmp_path)

    assert run.returncode == 1, run.stdout + run.stderr
    broken = [line for line in run.stdout.splitlines() if line.rstrip().endswith("BROKEN")]
    assert any(contract in line for line in broken), run.stdout
    assert statement.split()[-1] in run.stdout, run.stdout
