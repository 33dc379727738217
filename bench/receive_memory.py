"""Benchmark: what one web process holds for webhooks at each of its caps (docs/architecture.md).

Not a test. It needs PostgreSQL on 127.0.0.1:5432 and uses its own database
(`eventdrop_bench_memory`), which it creates and migrates if needed and empties before each
phase. Each phase starts the production server as the Procfile does (`python -m
eventdrop.web`) with one worker process (WEB_CONCURRENCY=1; the caps are per process) and
its production defaults, warms it up with 200 ordinary webhooks, then drives one cap to the
full while it samples the worker's resident set (VmRSS) every 0.1 s:

- `idle`: nothing more (the warmed-up process);
- `heads`: WEB_MAX_CONNECTIONS connections, each sending a head of WEB_MAX_HEADER_BYTES
  minus 1 KiB that never ends (the header deadline is raised for this phase only, so that
  all are open at once);
- `tricklers`: WEB_MAX_CONCURRENT_REQUESTS webhooks whose bodies stop after their first byte;
- `bodies`: with `ingress_rawevent` locked (ACCESS EXCLUSIVE), `--bodies` webhooks of 1 MiB
  of random bytes at once: as many as WEB_MAX_BODY_BYTES_IN_FLIGHT holds wait for the store
  (their INSERTs blocked, their parameters built), the others are answered 503;
- `all`: the three at once (heads on the connections the others leave).

It prints, per phase, the peak RSS and its growth over `idle`, in MiB, and the statuses the
webhooks got; with `--json-out FILE` the same as JSON.

    .venv/bin/python bench/receive_memory.py
    .venv/bin/python bench/receive_memory.py --phases idle,tricklers --bodies 8
"""

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the checkout's packages, bench/ included

from bench.ingress_ack import bench_env, free_port, start_server, stop  # noqa: E402
from tests.support.processes import PeakRSS  # noqa: E402

DB_NAME = "eventdrop_bench_memory" + os.environ.get("EVENTDROP_BENCH_DB_SUFFIX", "")
SERVER_URL = "postgres://postgres@127.0.0.1:5432"
PATH = "/webhooks/stripe/"
SIGNATURE = b"Stripe-Signature: t=1,v1=00\r\n"
BODY_BYTES = 1024 * 1024  # a source's default max_body_bytes
SETTLE_SECONDS = 1.5  # the samples taken once everything is sent


def prepare_database(env: dict[str, str]) -> str:
    url = f"{SERVER_URL}/{DB_NAME}"
    sys.path.insert(0, str(ROOT))  # this checkout's bench package
    from bench import reusable_database

    env = {**env, "DATABASE_URL": url}

    def migrate() -> None:
        for command in (["migrate", "--noinput", "--skip-checks", "-v0"],
                        ["raw_event_partitions", "--skip-checks"]):
            subprocess.run([sys.executable, str(ROOT / "manage.py"), *command], env=env,
                           cwd=ROOT, check=True, stdout=subprocess.DEVNULL)

    reusable_database(SERVER_URL, DB_NAME, migrate)
    return url


def post(port: int, body: bytes) -> str:
    """The answer's status and error code ("202", "503 busy")."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", PATH, body=body, headers={"Stripe-Signature": "t=1,v1=00"})
        response = conn.getresponse()
        answer = json.loads(response.read() or b"{}")
        return f"{response.status} {answer.get('error', '')}".strip()
    finally:
        conn.close()


def open_heads(port: int, count: int, head_bytes: int, stack: ExitStack) -> None:
    padding = b"X-Pad: " + b"p" * (head_bytes - 1024)
    for _ in range(count):
        sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=30))
        sock.sendall(b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + padding)


def open_tricklers(port: int, count: int, stack: ExitStack) -> None:
    head = (b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + SIGNATURE
            + b"Content-Length: 1000\r\n\r\nx")
    for _ in range(count):
        sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=30))
        sock.sendall(head)


def send_bodies(port: int, count: int) -> tuple[list[threading.Thread], list[str]]:
    statuses: list[str] = []

    def one() -> None:
        try:
            statuses.append(post(port, os.urandom(BODY_BYTES)))
        except OSError as error:
            statuses.append(type(error).__name__)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, statuses


def run_phase(name: str, env: dict[str, str], url: str, args) -> dict:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE ingress_rawevent")
    port = free_port()
    phase_env = {
        "WEB_MAX_CONNECTIONS": str(args.connections),
        "WEB_MAX_CONCURRENT_REQUESTS": str(args.requests),
        "WEB_MAX_HEADER_BYTES": str(args.header_bytes),
    }
    if name in ("heads", "all"):
        phase_env["WEB_HEADER_READ_TIMEOUT_SECONDS"] = "15"
    server_args = argparse.Namespace(workers=1)
    with open(args.log, "ab") as log:
        server = start_server({**env, "DATABASE_URL": url}, ROOT, port, server_args, phase_env, log)
    try:
        worker = int(next(iter(subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(server.pid)], capture_output=True, text=True
        ).stdout.split()), server.pid))
        for n in range(200):
            post(port, b'{"id": "evt_warm_%d"}' % n)
        statuses: list[str] = []
        threads: list[threading.Thread] = []
        with PeakRSS(worker) as rss, ExitStack() as stack:
            idle = PeakRSS.rss(worker) or 0
            bodies = args.bodies if name in ("bodies", "all") else 0
            tricklers = args.requests - bodies if name == "all" else args.requests
            if name in ("tricklers", "all"):
                open_tricklers(port, tricklers, stack)
            if name in ("heads", "all"):
                room = args.connections - (tricklers + bodies if name == "all" else 0) - 1
                open_heads(port, room, args.header_bytes, stack)
            if name in ("bodies", "all"):
                lock = stack.enter_context(psycopg.connect(url))
                lock.execute("LOCK TABLE ingress_rawevent IN ACCESS EXCLUSIVE MODE")
                threads, statuses = send_bodies(port, bodies)
            time.sleep(SETTLE_SECONDS)
            for thread in threads:
                thread.join(timeout=60)
        return {"phase": name, "idle_mib": round(idle / 2**20, 1),
                "peak_mib": round(rss.peak[worker] / 2**20, 1),
                "growth_mib": round((rss.peak[worker] - idle) / 2**20, 1),
                "statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))}}
    finally:
        stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", default="idle,heads,tricklers,bodies,all")
    parser.add_argument("--connections", type=int, default=512, help="WEB_MAX_CONNECTIONS")
    parser.add_argument("--requests", type=int, default=256, help="WEB_MAX_CONCURRENT_REQUESTS")
    parser.add_argument("--header-bytes", type=int, default=64 * 1024,
                        help="WEB_MAX_HEADER_BYTES")
    parser.add_argument("--bodies", type=int, default=24, help="1 MiB bodies sent at once")
    parser.add_argument("--log", default="/tmp/eventdrop_bench_memory.log")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    env = bench_env("")
    env["DJANGO_SETTINGS_MODULE"] = "eventdrop.settings"
    url = prepare_database(env)
    results = []
    for name in args.phases.split(","):
        result = run_phase(name, env, url, args)
        results.append(result)
        print(f"{name:>10}: peak {result['peak_mib']:7.1f} MiB, growth over idle "
              f"{result['growth_mib']:6.1f} MiB, statuses {result['statuses']}", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
