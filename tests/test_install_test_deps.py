"""The system tools the suite needs: the install script names what is missing, and a test
whose tool is missing is skipped with the install line, or fails on CI. About 1 s."""

import re
import shutil
import subprocess

import pytest

from tests.support.processes import ROOT
from tests.support.tools import TABLE, install_line, tool

SCRIPT = ROOT / "scripts" / "install-test-deps.sh"


def table() -> list[tuple[str, list[str]]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, *packages = line.split()
            rows.append((name, packages))
    return rows


def check(path: str) -> subprocess.CompletedProcess:
    """The script's report-only mode, with only `path` to find commands on."""
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, str(SCRIPT), "--check"],
        env={"PATH": path},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_the_check_names_every_missing_package_and_installs_nothing(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = check(str(empty))
    # On an empty PATH every tool is missing, except one named by a path that exists.
    missing = [
        package
        for name, packages in table()
        if shutil.which(name, path=str(empty)) is None
        for package in packages
    ]
    assert {
        "pgbouncer",
        "redis-server",
        "chromium-driver",
        "prometheus",
        "wrk",
        "postgresql-common",
        "postgresql-client",
        "git",
        "curl",
        "openssl",
        "procps",
    } <= set(missing)
    assert result.returncode == 1
    assert result.stdout == (
        f"install-test-deps: missing {' '.join(missing)} "
        f"(as root: apt-get update && apt-get install {' '.join(missing)})\n"
    )
    assert result.stderr == ""


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_the_check_is_quiet_when_nothing_is_missing(tmp_path):
    """Every tool found (each a stub on PATH here; a path that the machine lacks is the one
    thing a PATH cannot supply)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, _ in table():
        if "/" not in name:
            (stubs / name).write_text("#!/bin/sh\n")
            (stubs / name).chmod(0o755)
    result = check(str(stubs))
    absent = [
        p
        for name, packages in table()
        if "/" in name and shutil.which(name) is None
        for p in packages
    ]
    if absent:
        assert result.stdout.startswith(f"install-test-deps: missing {' '.join(absent)} (")
    else:
        assert (result.returncode, result.stdout) == (0, "")


def test_a_missing_tool_skips_with_its_install_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(
        pytest.skip.Exception,
        match=r"^pgbouncer is missing: apt-get install "
        r"pgbouncer$",
    ):
        tool("pgbouncer")
    with pytest.raises(pytest.skip.Exception, match=r"apt-get install chromium-driver$"):
        tool("chromedriver")


def test_on_ci_a_missing_tool_fails_the_test(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(
        pytest.fail.Exception,
        match=r"^promtool is missing, and CI runs every "
        r"test: apt-get install prometheus",
    ):
        tool("promtool")


def test_a_tool_found_is_its_path(tmp_path, monkeypatch):
    (tmp_path / "wrk").write_text("#!/bin/sh\n")
    (tmp_path / "wrk").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    assert tool("wrk") == str(tmp_path / "wrk")


def test_every_tool_a_test_asks_for_is_in_the_table():
    names = {name for name, _ in table()}
    asked = {
        name
        for path in (ROOT / "tests").rglob("*.py")
        for name in re.findall(r'\btool\("([^"]+)"\)', path.read_text())
    }
    assert asked <= names, asked - names
    assert install_line("/usr/bin/chromium") == "apt-get install chromium"
