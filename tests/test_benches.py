"""Every benchmark in bench/ runs, at a tiny size: it starts, measures and prints its figure.

Nothing else runs the benchmarks, so one that no longer starts went unnoticed until somebody
wanted its figure (bench/bulk_replay_job.py stopped while loading its rows, issue 26). Each
script runs here as a developer runs it, from the checkout with the virtualenv's Python, in
a size that takes seconds, and must exit 0 within BENCH_SECONDS and print the line that
carries its figure. Nothing is asserted about the figures: they are measured, at full size,
in docs/benchmarks.md.

The benchmarks use databases of their own (`eventdrop_bench_*`, each recreated or emptied by
its script) on the PostgreSQL at 127.0.0.1:5432, as their docstrings say;
EVENTDROP_BENCH_DB_SUFFIX gives a second checkout benching at once databases of its own.
"""

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.support.processes import ROOT
from tests.support.tools import tool

pytestmark = pytest.mark.slow
# Each bench has databases and ports of its own: they may run on several workers at once.
SPREAD_ACROSS_WORKERS = True

BENCH = ROOT / "bench"
BENCH_SECONDS = 240

# Each script: its tiny size, and text the line with its figure carries. The raw events the
# bulk replay and the ops page load are more than one INSERT may bind (bench/bulk_insert.py),
# where their loading broke.
BENCHES = {
    "bulk_replay_job.py": (["--events", "3000", "--workers", "1"], '"slo_within_2_min"'),
    "console_scale.py": (["--events", "3000", "--requests", "1", "--drop"], "worst p95"),
    "dispatch_throughput.py": (["--rows", "20", "--concurrency", "1"], "rows/s"),
    "encryption_at_rest.py": (["--calls", "5", "--rounds", "1"], "encrypted / plaintext"),
    "inbox_throughput.py": (["--events", "300", "--workers", "1"], "events/s"),
    "ingress_ack.py": (
        # Against the plain ASGI application too, so that it does not rot either.
        [
            "--connections",
            "1",
            "--seconds",
            "1",
            "--ceiling-seconds",
            "1",
            "--baseline",
            ".",
            "--baseline-env",
            "BENCH_APPLICATION=bench.plain_asgi:application",
            # The current server traced (docs/tracing.md), exporting to the bench's sink.
            "--otlp-sink",
        ],
        "rows: every 2xx is a row",
    ),
    "ops_page.py": (["--events", "3000", "--requests", "2"], "p50 x base"),
    "ordered_claim.py": (
        ["--deliveries", "200", "--keys", "10", "--passes", "2"],
        '"key_heads_claim"',
    ),
    "receive_memory.py": (
        ["--phases", "idle,all", "--connections", "16", "--requests", "8", "--bodies", "2"],
        "growth over idle",
    ),
    "store_path.py": (["--calls", "20", "--rounds", "1"], "after/before"),
}
# What a script needs beyond PostgreSQL (scripts/test-tools.txt says what installs each).
TOOLS = {"ingress_ack.py": ("wrk", "pgbench")}


def bench_scripts() -> set[str]:
    """The scripts in bench/ (a module run as a program), not its helpers and settings."""
    return {
        path.name for path in BENCH.glob("*.py") if 'if __name__ == "__main__":' in path.read_text()
    }


def test_every_bench_script_is_run_here():
    assert bench_scripts() == set(BENCHES), "add the new script to BENCHES, with a tiny size"


@pytest.mark.parametrize("script", sorted(BENCHES))
def test_the_bench_runs_at_a_tiny_size(script: str, tmp_path: Path):
    for name in TOOLS.get(script, ()):
        tool(name)  # skipped with its install line when missing (failed on CI)
    try:
        psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"the benchmarks measure on PostgreSQL at 127.0.0.1:5432, which refused: {exc}")
    args, figure = BENCHES[script]
    # As from a developer's shell: each script picks its own settings and database.
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")
    }
    env["TMPDIR"] = str(tmp_path)
    try:
        result = subprocess.run(
            [sys.executable, str(BENCH / script), *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=BENCH_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{script} {' '.join(args)} still ran after {BENCH_SECONDS} s: "
            f"{(exc.stdout or b'')[-2000:]!r} {(exc.stderr or b'')[-2000:]!r}"
        )
    output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{output}"
    assert figure in result.stdout, f"{script} printed no {figure!r}:\n{output}"
