"""Benchmark: how fast the webhook endpoint acknowledges, against PostgreSQL's own ceiling.

Not a test. It needs PostgreSQL on 127.0.0.1:5432 (and `pgbench`) and uses its own database
(`eventdrop_bench`), which it creates and migrates if needed and empties before each run.
One run measures, on this machine and within a few minutes:

1. **the ceiling**: `pgbench` running the webhook's own INSERT (bench/pgbench_raw_event_insert.sql:
   one row, every column the store writes, the body the HTTP load sends, one transaction
   each) into today's partition of
   `ingress_rawevent`, at the same number of connections as the HTTP load. Run right before
   and right after each webhook phase (the server idle meanwhile): that phase's ratio is
   taken against the mean of its two, and the ratio printed for a server is the median of
   its phases' ratios, so that the VM's speed, which moves by tens of per cent from one
   minute to the next, is taken out as far as it can be. pgbench sends it as a
   prepared statement (`-M prepared`), as the app's store does since it binds on the server
   (DATABASE_PREPARE_THRESHOLD, eventdrop/settings.py): the ceiling is what PostgreSQL takes
   of the INSERT as the store issues it. `--ceiling-protocol simple` (parsed and planned
   every time) is the ceiling of the earlier runs, for a server that binds on the client.
2. **the webhook**: the real app, started exactly as the Procfile starts it
   (`python -m eventdrop.web`: granian, eventdrop/web.py) with bench/settings_bench.py, driven
   by `wrk` (a C load generator: little of the two cores goes to the client) over keep-alive
   connections with signed-looking Stripe POSTs (a ~1.5 KiB `checkout.session.completed`
   body, unique per request). `apt-get update && apt-get install wrk` is run when it is
   missing; without it (or with `--client python`) a Python client in a second process does
   the same, slower.
3. **the no-write baseline**: the same requests at `/bench/noop/stripe/`, a Django view
   behind the same server (Django's own ASGI handler and middleware) that reads the body and
   answers 202 writing nothing: what a webhook would cost as an ordinary Django view.

It prints ACK/s, p50/p95/p99 and the server's CPU per answered request (its workers' user +
system time from /proc) of each phase, the share of the machine its host took meanwhile
(`steal%`: a VM's phase with much of it ran on a slower machine than its ceilings), the
ceiling, and the two ratios (webhook / ceiling: the figure issue 15 sets at >= 0.5; webhook /
no-write; with `--rounds N` each server has N webhook phases per connection count, each with
its pair of ceilings). Rows are checked: every 2xx
must be a row (rows >= 2xx), and at most the requests still in flight when the load stopped
may be rows without an answer counted (wrk stops on a clock). Otherwise it exits 1.

    .venv/bin/python bench/ingress_ack.py                       # 16 connections, then 1
    .venv/bin/python bench/ingress_ack.py --slow-clients 32     # ... and again under 32 slow ones
    .venv/bin/python bench/ingress_ack.py --baseline HEAD~3 --rounds 2 --connections 16

`--baseline REV` also runs the server from `git archive REV` (the code before a change; REV may
also be a directory holding a tree),
alternating baseline and current `--rounds` times in the same run, and prints each pair's
ratio: absolute figures here move by tens of per cent within an hour, ratios within one run
do not.
`--server-env NAME=VALUE` sets an environment variable for the current server only (to
measure a setting; `--baseline-env` for the baseline: `--baseline .` with two environments
compares two settings of one tree). `--slow-clients N` repeats the 16-connection webhook
phase while N more connections trickle a webhook body at 1 byte/s (reconnecting whenever
they are cut off) and prints the ratio to the phase without them (issue 15: within 20 %).
`--json-out FILE` writes the figures (bench/inbox_throughput.py --ingress-json reads
`ack_per_s`). `--py-spy DIR` records every server worker with py-spy during the webhook
phase at the most connections (collapsed stacks into DIR) and prints the top frames (py-spy
needs ptrace: root, or `kernel.yama.ptrace_scope` 0).

`--otlp-sink` turns tracing on in the current server (kernel/tracing.py): a sink in this
process that takes OTLP/HTTP exports and drops them is its OTEL_EXPORTER_OTLP_ENDPOINT, so
the server pays for its spans and their export, not for a collector. OTEL_* variables of
the shell reach neither server; pass them with `--server-env`. `--otlp-sink baseline`
traces the baseline instead (with `--baseline-env`): the same pair with the sides swapped,
so that a bias of the bench towards one side cancels; `both` compares two ways of tracing.
Tracing's cost on the
receive path (docs/benchmarks.md, "Tracing"):

    .venv/bin/python bench/ingress_ack.py --baseline <rev before tracing> --interleave 12 \
        --connections 16 --ceiling-seconds 3 --otlp-sink \
        --server-env OTEL_TRACES_SAMPLER=parentbased_traceidratio \
        --server-env OTEL_TRACES_SAMPLER_ARG=0.1

`--baseline REV --interleave PAIRS` compares two servers at one machine speed: both run side by
side and wrk alternates between them in `--interleave-seconds` slices (3 s), with pgbench's
ceiling between the pairs, printing each pair's ratios of ACK/s and of server CPU per webhook,
each server's ratio to the ceiling and p99, and their medians (no no-write phase). On this VM
the speed drifts by tens of per cent within minutes (steal time), more than a change of a
tenth can be told from in `--rounds` phases minutes apart.

    .venv/bin/python bench/ingress_ack.py --baseline HEAD~1 --interleave 12 --connections 16 \\
        --ceiling-seconds 3

Everything listens on 127.0.0.1 only, and everything it started is stopped at the end.
"""

import argparse
import http.client
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
DB_NAME = "eventdrop_bench" + os.environ.get("EVENTDROP_BENCH_DB_SUFFIX", "")
SERVER_URL = "postgres://postgres@127.0.0.1:5432"
WEBHOOK_PATH = "/webhooks/stripe/"
NOOP_PATH = "/bench/noop/stripe/"
PGBENCH_SCRIPT = ROOT / "bench" / "pgbench_raw_event_insert.sql"
# The pgbench rows carry this address, so the HTTP rows can be counted apart from them.
PGBENCH_REMOTE_ADDR = "127.0.0.2"
HTTP_REMOTE_ADDR = "127.0.0.1"
REQUEST_TIMEOUT_SECONDS = 10
SERVER_START_SECONDS = 30
WARMUP_SECONDS = 2.0
# Files the server needs that a baseline revision may predate.
BENCH_SUPPORT_FILES = ("bench/__init__.py", "bench/settings_bench.py", "bench/urls_bench.py")

# A Stripe `checkout.session.completed` event as Stripe sends it (~1.5 KiB). `{n}` changes per
# request (so no two bodies are the same), `{ts}` and `{exp}` are timestamps.
BODY_TEMPLATE = (
    '{{"id": "evt_{n:0>24}", "object": "event", "api_version": "2024-06-20", '
    '"created": {ts}, "data": {{"object": {{"id": "cs_test_{n:0>58}", '
    '"object": "checkout.session", "after_expiration": null, "allow_promotion_codes": null, '
    '"amount_subtotal": 1900, "amount_total": 1900, "automatic_tax": {{"enabled": false, '
    '"liability": null, "status": null}}, "billing_address_collection": null, '
    '"cancel_url": "https://eventdrop.example/recaps/cancelled", '
    '"client_reference_id": "recap_{n}", "consent": null, "consent_collection": null, '
    '"created": {ts}, "currency": "eur", "customer": "cus_Q1w2E3r4T5y6U7", '
    '"customer_creation": "if_required", "customer_details": {{"address": {{"city": "Berlin", '
    '"country": "DE", "line1": "Torstrasse 1", "line2": null, "postal_code": "10119", '
    '"state": null}}, "email": "guest{n}@example.com", "name": "Event Guest", '
    '"phone": null, "tax_exempt": "none", "tax_ids": []}}, "customer_email": null, '
    '"expires_at": {exp}, "invoice": null, "livemode": false, "locale": "de", '
    '"metadata": {{"recap_id": "{n}", "event_slug": "summer-party-2026"}}, '
    '"mode": "payment", "payment_intent": "pi_3PqRsTuVwXyZ{n:0>12}", '
    '"payment_method_types": ["card", "sepa_debit"], "payment_status": "paid", '
    '"shipping_details": null, "status": "complete", '
    '"success_url": "https://eventdrop.example/recaps/thanks", "total_details": '
    '{{"amount_discount": 0, "amount_shipping": 0, "amount_tax": 0}}, "url": null}}}}, '
    '"livemode": false, "pending_webhooks": 1, "request": {{"id": null, '
    '"idempotency_key": null}}, "type": "checkout.session.completed"}}'
)


@dataclass
class Phase:
    server: str  # "current" or "baseline"
    round: int
    endpoint: str  # "webhook" or "noop"
    connections: int
    slow_clients: int
    seconds: float
    ok: int  # 2xx answers
    other: int  # other answers and client errors
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    rows: int | None = None  # rows the phase stored (webhook phases)
    server_cpu_us: float | None = None  # the server workers' CPU per 2xx (user + system)
    # The share of the machine's CPU time the VM's host took during the load (/proc/stat's
    # steal): a phase with much of it ran on a slower machine than its ceilings did.
    steal_pct: float | None = None
    slow_answers: dict = field(default_factory=dict)
    # pgbench's ceiling at the same connections right before and right after this phase
    # (webhook phases without slow clients): the ceiling the phase's ratio is taken against.
    ceilings: list[float] = field(default_factory=list)

    @property
    def ceiling(self) -> float | None:
        return sum(self.ceilings) / len(self.ceilings) if self.ceilings else None

    @property
    def ratio_to_ceiling(self) -> float | None:
        return self.rate / self.ceiling if self.ceiling else None

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


# --- the load: wrk, or a Python client as the fallback -------------------------------------

WRK_SCRIPT = r"""
-- Generated by bench/ingress_ack.py: unique signed-looking Stripe POSTs, per-status counts.
local template = [==[%(template)s]==]
local path = "%(path)s"
local threads = {}
local counter = 0
-- Globals: done() reads them from each thread with thread:get().
ok, other = 0, 0

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

local function hex(n)
  local t = {}
  for i = 1, n do t[i] = string.format("%%x", math.random(0, 15)) end
  return table.concat(t)
end

-- The template cut once per thread at its {N}/{TS}/{EXP} marks, so a request is one
-- table.concat, not three gsub() over the whole body (LuaJIT does not compile gsub: that was
-- most of the client's CPU per request, CPU the server under test did not get).
local pieces, marks = {}, {}
local signature_head

function init(args)
  math.randomseed(os.time() * 1000 + tid)
  local at = 1
  while true do
    local first, last, mark = template:find("{(%%u+)}", at)
    if not first then break end
    pieces[#pieces + 1] = template:sub(at, first - 1)
    marks[#marks + 1] = mark
    at = last + 1
  end
  pieces[#pieces + 1] = template:sub(at)
  -- 56 random hex digits per thread and 8 from the counter: 64, as Stripe's v1.
  signature_head = hex(56)
end

function request()
  counter = counter + 1
  local now = os.time()
  local values = {
    N = string.format("%%d%%09d", tid, counter), TS = tostring(now), EXP = tostring(now + 86400),
  }
  local parts = {}
  for i = 1, #marks do
    parts[2 * i - 1] = pieces[i]
    parts[2 * i] = values[marks[i]]
  end
  parts[2 * #marks + 1] = pieces[#pieces]
  local headers = {
    ["Content-Type"] = "application/json; charset=utf-8",
    ["User-Agent"] = "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
    ["Stripe-Signature"] = "t=" .. now .. ",v1=" .. signature_head
      .. string.format("%%08x", counter %% 4294967296),
  }
  return wrk.format("POST", path, headers, table.concat(parts))
end

function response(status, headers, body)
  if status >= 200 and status < 300 then ok = ok + 1 else other = other + 1 end
end

function done(summary, latency, requests)
  local total_ok, total_other = 0, 0
  for _, thread in ipairs(threads) do
    total_ok = total_ok + thread:get("ok")
    total_other = total_other + thread:get("other")
  end
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"seconds": %%f, "ok": %%d, "other": %%d, "socket_errors": %%d, ' ..
    '"p50_us": %%d, "p95_us": %%d, "p99_us": %%d, "max_us": %%d}\n',
    summary.duration / 1e6, total_ok, total_other, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99), latency.max))
end
"""


def _wrk_template() -> str:
    # wrk's Lua fills {N}, {TS}, {EXP}; the Python template's zero padding is done in Lua too
    # (a 10-digit n padded by the fixed text around it is unique, which is all it needs).
    body = BODY_TEMPLATE.replace("{n:0>24}", "{N}").replace("{n:0>58}", "{N}")
    body = body.replace("{n:0>12}", "{N}").replace("{n}", "{N}")
    body = body.replace("{ts}", "{TS}").replace("{exp}", "{EXP}")
    return body.replace("{{", "{").replace("}}", "}").replace("{N}", "{N}")


def ensure_wrk() -> str | None:
    found = shutil.which("wrk")
    if found:
        return found
    # The package lists first: on a fresh machine they may be empty or stale.
    sudo = ["sudo", "-n"] if os.geteuid() != 0 and shutil.which("sudo") else []
    steps = [[*sudo, "apt-get", "update", "-qq"], [*sudo, "apt-get", "install", "-y", "-q", "wrk"]]
    print("wrk is missing: " + " && ".join(" ".join(step) for step in steps), file=sys.stderr)
    try:
        for step in steps:
            subprocess.run(step, check=True, timeout=300, stdout=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"could not install wrk ({exc}); using the Python client", file=sys.stderr)
        return None
    return shutil.which("wrk")


def run_wrk(wrk: str, port: int, path: str, connections: int, seconds: float, script_dir: str):
    script = Path(script_dir) / f"wrk_{path.strip('/').replace('/', '_')}.lua"
    script.write_text(WRK_SCRIPT % {"template": _wrk_template(), "path": path})
    command = [
        wrk,
        f"-t{min(2, connections)}",
        f"-c{connections}",
        f"-d{seconds:g}s",
        f"--timeout={REQUEST_TIMEOUT_SECONDS}s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}{path}",
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    match = re.search(r"^WRK_JSON (.*)$", out.stdout, re.MULTILINE)
    if out.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout}\n{out.stderr}")
    raw = json.loads(match.group(1))
    return {
        "seconds": raw["seconds"],
        "ok": raw["ok"],
        "other": raw["other"] + raw["socket_errors"],
        "p50_ms": raw["p50_us"] / 1000,
        "p95_ms": raw["p95_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
    }


def _percentile(ordered: list[float], p: float) -> float:
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def fire(port: int, path: str, connections: int, seconds: float) -> dict:
    """The Python client: POST from `connections` keep-alive connections for `seconds`."""
    lock = threading.Lock()
    counter = [0]
    ok = [0]
    other = [0]
    latencies: list[float] = []
    stop_at = time.monotonic() + seconds

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_SECONDS)
        try:
            while time.monotonic() < stop_at:
                with lock:
                    counter[0] += 1
                    n = counter[0]
                now = int(time.time())
                body = BODY_TEMPLATE.format(n=n, ts=now, exp=now + 86400).encode()
                headers = {
                    "Content-Type": "application/json; charset=utf-8",
                    "User-Agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
                    "Stripe-Signature": f"t={now},v1={secrets.token_hex(32)}",
                }
                started = time.perf_counter()
                try:
                    conn.request("POST", path, body=body, headers=headers)
                    response = conn.getresponse()
                    response.read()
                    good = 200 <= response.status < 300
                except (OSError, http.client.HTTPException):
                    conn.close()  # http.client reconnects on the next request
                    good = False
                elapsed = (time.perf_counter() - started) * 1000
                with lock:
                    (ok if good else other)[0] += 1
                    latencies.append(elapsed)  # a timeout is a latency too
        finally:
            conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ordered = sorted(latencies)
    return {
        "seconds": time.perf_counter() - started,
        "ok": ok[0],
        "other": other[0],
        "p50_ms": _percentile(ordered, 50),
        "p95_ms": _percentile(ordered, 95),
        "p99_ms": _percentile(ordered, 99),
        "max_ms": _percentile(ordered, 100),
    }


class SlowClients:
    """`count` connections, each sending a webhook's headers and then its body at 1 byte/s,
    reconnecting whenever the server answers or closes. Counts the answers they got."""

    BODY_BYTES = 1000

    def __init__(self, port: int, count: int):
        self.port, self.count = port, count
        self.stopping = threading.Event()
        self.answers: dict[str, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def __enter__(self) -> "SlowClients":
        for thread in self.threads:
            thread.start()
        time.sleep(2 if self.count else 0)  # all of them connected and mid-body
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=5)

    def _run(self) -> None:
        head = (
            f"POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/json\r\nStripe-Signature: t=1,v1=00\r\n"
            f"Content-Length: {self.BODY_BYTES}\r\n\r\n"
        ).encode()
        while not self.stopping.is_set():
            answer = "error"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    sock.sendall(head)
                    sock.settimeout(1.0)
                    answer = self._trickle(sock)
            except OSError:
                pass
            with self.lock:
                self.answers[answer] = self.answers.get(answer, 0) + 1

    def _trickle(self, sock: socket.socket) -> str:
        for _ in range(self.BODY_BYTES):
            if self.stopping.is_set():
                return "still sending at the end"
            try:
                sock.sendall(b"x")
                data = sock.recv(4096)  # up to 1 s: the pace
            except TimeoutError:
                continue
            except OSError:
                return "closed"
            return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed"
        return "sent it all"


# --- the database and the ceiling ----------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_env(database_url: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(
            ("DJANGO_", "DATABASE_", "WEBHOOK_", "WEB_", "INGRESS_", "OTEL_")
        )
    }
    env.update(
        DJANGO_SETTINGS_MODULE="bench.settings_bench",
        # A developer's .env must not fill in what the benchmark left out on purpose.
        PYTHON_DOTENV_DISABLED="1",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_DEBUG="0",  # DEBUG would keep every query in memory
        ALLOWED_HOSTS="127.0.0.1",
        DATABASE_URL=database_url,
        LOG_LEVEL="WARNING",
        STRIPE_WEBHOOK_SECRET="whsec_bench_" + secrets.token_hex(16),
        GITHUB_WEBHOOK_SECRET=secrets.token_hex(16),
        SLACK_SIGNING_SECRET=secrets.token_hex(16),
        RENDERER_WEBHOOK_SECRET="whsec_" + secrets.token_hex(16),
    )
    return env


class OtlpSink:
    """An OTLP/HTTP endpoint that answers every export 200 and keeps nothing (--otlp-sink)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        sink = self
        self.exports = 0
        self.spans: dict[str, int] = {}  # span name -> how many were exported

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sink.exports += 1
                sink.count(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, body: bytes) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans[span.name] = self.spans.get(span.name, 0) + 1

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def psql(database: str, *statements: str) -> list:
    import psycopg

    with psycopg.connect(f"{SERVER_URL}/{database}", autocommit=True) as conn:
        rows: list = []
        for statement in statements:
            cursor = conn.execute(statement)
            rows = cursor.fetchall() if cursor.description else []
        return rows


def prepare_database(env: dict[str, str], root: Path) -> dict[str, str]:
    sys.path.insert(0, str(ROOT))  # this checkout's bench package
    from bench import reusable_database

    manage = [sys.executable, str(root / "manage.py")]
    env = {**env, "PYTHONPATH": str(root)}
    reusable_database(
        SERVER_URL,
        DB_NAME,
        lambda: subprocess.run(
            [*manage, "migrate", "--noinput", "--skip-checks", "-v0"], env=env, cwd=root, check=True
        ),
        root,
    )
    # As in production: today's partition exists, rows do not land in the DEFAULT partition.
    subprocess.run(
        [*manage, "raw_event_partitions", "--skip-checks"],
        env=env,
        cwd=root,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    psql(DB_NAME, "TRUNCATE ingress_rawevent")
    check_pgbench_script()
    facts = psql(
        DB_NAME,
        "SELECT current_setting('server_version'), current_setting('synchronous_commit'), "
        "current_setting('fsync')",
    )[0]
    return {"postgres": facts[0], "synchronous_commit": facts[1], "fsync": facts[2]}


# The timestamps the pgbench script's body carries (fixed: pgbench has no clock to format).
PGBENCH_BODY_TS, PGBENCH_BODY_EXP = "1796176162", "1796262562"


def pgbench_body_template() -> str:
    """The body the pgbench script inserts, `{N}` replaced per transaction by a random number:
    the webhook's own body, not a filler. PostgreSQL compresses a body this size before it
    writes it, so a repetitive one (`repeat('x', 1547)`, the script's first version: 28 bytes
    stored against the real body's ~940) made the ceiling a cheaper INSERT than the store's."""
    body = _wrk_template().replace("{TS}", PGBENCH_BODY_TS)
    return body.replace("{EXP}", PGBENCH_BODY_EXP)


def check_pgbench_script() -> None:
    """The ceiling is only the webhook's ceiling if pgbench writes what the store writes:
    every column of the table but `id` (the store names them all, as Django's INSERT did),
    and a body like the webhook's (the template the HTTP load sends)."""
    sql = PGBENCH_SCRIPT.read_text()
    if f"replace('{pgbench_body_template()}', '{{N}}', :n::text)" not in sql:
        raise SystemExit(
            f"{PGBENCH_SCRIPT.name} does not insert the webhook's body "
            "(bench/ingress_ack.py pgbench_body_template())"
        )
    match = re.search(r"INSERT INTO ingress_rawevent \(([^)]*)\)", sql)
    scripted = [name.strip() for name in match.group(1).split(",")] if match else []
    table = [
        name
        for (name,) in psql(
            DB_NAME,
            "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' "
            "AND table_name = 'ingress_rawevent' AND column_name <> 'id' ORDER BY column_name",
        )
    ]
    if sorted(scripted) != table:
        raise SystemExit(
            f"{PGBENCH_SCRIPT.name} does not write the table's columns: missing "
            f"{sorted(set(table) - set(scripted))}, unknown {sorted(set(scripted) - set(table))}"
        )


def ceiling(args, connections: int) -> float:
    """The ceiling at `connections`, as the run's arguments ask for it."""
    return pgbench_ceiling(connections, args.ceiling_seconds, args.ceiling_protocol)


def pgbench_ceiling(connections: int, seconds: float, protocol: str) -> float:
    """Transactions per second of the webhook's INSERT, `connections` pgbench clients."""
    out = subprocess.run(
        [
            "pgbench",
            "-n",  # no vacuum of pgbench's own tables (there are none)
            "-M",
            protocol,
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-c",
            str(connections),
            "-j",
            str(min(2, connections)),
            "-T",
            str(int(seconds)),
            "-f",
            str(PGBENCH_SCRIPT),
            DB_NAME,
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    match = re.search(r"tps = ([\d.]+)", out.stdout)
    if out.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench failed ({out.returncode}): {out.stdout}\n{out.stderr}")
    return float(match.group(1))


def http_rows() -> int:
    import psycopg

    with psycopg.connect(f"{SERVER_URL}/{DB_NAME}", autocommit=True) as conn:
        query = "SELECT count(*) FROM ingress_rawevent WHERE remote_addr = %s"
        (count,) = conn.execute(query, [HTTP_REMOTE_ADDR]).fetchall()[0]
        return count


# --- the server ----------------------------------------------------------------------------


def revision_tree(revision: str, into: str, name: str) -> Path:
    if Path(revision).is_dir():  # a tree already unpacked (or another checkout)
        return Path(revision).resolve()
    root = Path(into) / name
    root.mkdir()
    archive = subprocess.run(
        ["git", "archive", revision], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    for name in BENCH_SUPPORT_FILES:
        target = root / name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, target)
    return root


def start_server(env: dict[str, str], root: Path, port: int, args, extra_env: dict, log):
    # BENCH_APPLICATION=module:attribute serves another ASGI application with the production
    # server's settings (bench/plain_asgi.py), not an environment variable of the server.
    extra_env = dict(extra_env)
    application = extra_env.pop("BENCH_APPLICATION", None)
    command = (
        ["-c", f"from eventdrop.web import serve; serve(target={application!r})"]
        if application
        else ["-m", "eventdrop.web"]  # the Procfile's web line
    )
    env = {
        **env,
        "PYTHONPATH": str(root),
        "PORT": str(port),
        "WEB_BIND": "127.0.0.1",
        "WEB_CONCURRENCY": str(args.workers),
        "WEB_LOG_LEVEL": "warning",
        **extra_env,
    }
    server = subprocess.Popen(
        [sys.executable, *command],
        env=env,
        cwd=root,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            log.flush()
            tail = Path(log.name).read_text()[-3000:]
            raise RuntimeError(f"the server exited with {server.returncode}:\n{tail}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", WEBHOOK_PATH)
            if conn.getresponse().status == 405:  # the app answers: ready
                conn.close()
                return server
        except OSError:
            time.sleep(0.2)
    stop(server)
    raise RuntimeError(f"the server did not answer in {SERVER_START_SECONDS}s; see {log.name}")


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


# --- one run -------------------------------------------------------------------------------


def server_workers(server: subprocess.Popen) -> list[int]:
    """The server's worker processes: the children of the process the bench started, or
    that process itself when it serves alone (a server without a supervisor)."""
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(server.pid)], capture_output=True, text=True
    )
    return [int(pid) for pid in out.stdout.split()] or [server.pid]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU the processes have used so far (from /proc; 0 where unreadable)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """(all CPU ticks, steal ticks) of the whole machine so far, from /proc/stat."""
    try:
        first_line = Path("/proc/stat").read_text().split("\n", 1)[0]
        fields = [int(value) for value in first_line.split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def py_spy_start(server: subprocess.Popen, seconds: float, out_dir: str, tag: str) -> list:
    """py-spy on every worker for `seconds`: collapsed stacks of the thread holding the GIL
    (where the Python CPU goes; waits on the database or a lock are not in them)."""
    recorders = []
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for pid in server_workers(server):
        out = Path(out_dir) / f"{tag}_{pid}.txt"
        recorders.append(
            (
                out,
                subprocess.Popen(
                    [
                        str(VENV_BIN / "py-spy"),
                        "record",
                        "--pid",
                        str(pid),
                        "--duration",
                        str(int(seconds)),
                        "--rate",
                        "200",
                        "--format",
                        "raw",
                        "--gil",
                        "--output",
                        str(out),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                ),
            )
        )
    return recorders


def perf_start(server: subprocess.Popen, seconds: float, out_dir: str, tag: str) -> list:
    """Linux perf on every worker for `seconds`, every thread and the kernel included (what
    py-spy's GIL samples leave out): DIR/TAG.data, for `perf report --sort comm,dso`."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    pids = ",".join(str(pid) for pid in server_workers(server))
    out = Path(out_dir) / f"{tag}.data"
    command = ["perf", "record", "-q", "-F", "499", "-g", "-p", pids, "-o", str(out)]
    command += ["--", "sleep", str(int(seconds))]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return [(out, process)]


def py_spy_report(recorders: list, top: int = 25) -> None:
    """The frames with the most samples, inclusive and self, over every worker and thread."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for out, process in recorders:
        _, err = process.communicate(timeout=120)
        if process.returncode != 0 or not out.exists():
            print(f"py-spy failed ({process.returncode}): {err.decode()[-500:]}")
            continue
        for line in out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            n = int(count)
            frames = [f for f in stack.split(";") if f and not f.startswith("thread (")]
            if not frames:
                continue
            total += n
            for frame in set(frames):
                inclusive[frame] = inclusive.get(frame, 0) + n
            own[frames[-1]] = own.get(frames[-1], 0) + n
    if not total:
        return
    print(f"\npy-spy: {total} samples over the workers; top frames, inclusive %:")
    for frame, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / total:5.1f}  {frame}")
    print("top frames, self %:")
    for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {100 * n / total:5.1f}  {frame}")


class Load:
    def __init__(self, wrk: str | None, script_dir: str, pool):
        self.wrk, self.script_dir, self.pool = wrk, script_dir, pool

    def __call__(self, port: int, path: str, connections: int, seconds: float) -> dict:
        if self.wrk:
            return run_wrk(self.wrk, port, path, connections, seconds, self.script_dir)
        return self.pool.submit(fire, port, path, connections, seconds).result()


def measure_server(label, round_no, root, extra_env, env, args, load, workdir) -> list[Phase]:
    port = free_port()
    phases: list[Phase] = []
    with open(Path(workdir) / f"server_{label}_{round_no}.log", "w") as log:
        server = start_server(env, root, port, args, extra_env, log)
        try:
            load(port, WEBHOOK_PATH, max(args.connections), WARMUP_SECONDS)  # imports, pools
            load(port, NOOP_PATH, max(args.connections), WARMUP_SECONDS)
            plan = [(c, 0) for c in args.connections]
            if args.slow_clients:
                plan.append((max(args.connections), args.slow_clients))
            for connections, slow in plan:
                for endpoint, path in (("webhook", WEBHOOK_PATH), ("noop", NOOP_PATH)):
                    if slow and endpoint == "noop":
                        continue
                    before = http_rows() if endpoint == "webhook" else None
                    spying = (
                        args.py_spy
                        and endpoint == "webhook"
                        and not slow
                        and connections == max(args.connections)
                    )
                    workers = server_workers(server)
                    paired = endpoint == "webhook" and not slow
                    ceilings = [ceiling(args, connections)] if paired else []
                    if spying:  # after the ceiling's pgbench: py-spy records the load only
                        recorders = py_spy_start(
                            server, args.seconds, args.py_spy, f"{label}_{round_no}"
                        )
                        if args.perf:
                            perfs = perf_start(
                                server, args.seconds, args.py_spy, f"perf_{label}_{round_no}"
                            )
                    with SlowClients(port, slow) as slow_clients:
                        cpu_before, ticks_before = cpu_seconds(workers), machine_ticks()
                        figures = load(port, path, connections, args.seconds)
                        cpu_used = cpu_seconds(workers) - cpu_before
                        ticks_after = machine_ticks()
                    if paired:
                        ceilings.append(ceiling(args, connections))
                    if spying:
                        py_spy_report(recorders)
                        if args.perf:
                            for _, process in perfs:
                                process.communicate(timeout=120)
                    phase = Phase(
                        server=label,
                        round=round_no,
                        endpoint=endpoint,
                        connections=connections,
                        slow_clients=slow,
                        slow_answers=dict(slow_clients.answers),
                        ceilings=ceilings,
                        **figures,
                    )
                    if before is not None:
                        phase.rows = http_rows() - before
                    if phase.ok:
                        phase.server_cpu_us = cpu_used / phase.ok * 1e6
                    if ticks_after[0] > ticks_before[0]:
                        phase.steal_pct = (
                            100
                            * (ticks_after[1] - ticks_before[1])
                            / (ticks_after[0] - ticks_before[0])
                        )
                    phases.append(phase)
                    print_phase(phase)
        finally:
            stop(server)
    return phases


def interleave(servers, env, args, load, workdir) -> bool:
    """`--interleave PAIRS`: the baseline's and the current server run side by side (both
    idle but for the slice being measured), and wrk alternates between them in short
    slices, PAIRS pairs, the order swapped every pair, with pgbench's ceiling at the same
    connections measured before the first pair and after each (the servers idle meanwhile).
    The VM's speed drifts over minutes (steal time from its host: tens of per cent), so
    slices seconds apart compare the two servers at one speed, where `--rounds` phases
    minutes apart do not. Prints, per pair, each server's ACK/s, CPU per webhook and ratio to
    the mean of the pair's two ceilings; then the medians: current / baseline (ACK/s, CPU per
    webhook), each server's ratio to the ceiling and p99. Rows are checked per slice."""
    connections = max(args.connections)
    started = {}
    logs = []
    ok = True
    try:
        for label, root, server_env in servers:
            log = open(Path(workdir) / f"server_{label}_interleaved.log", "w")  # noqa: SIM115
            logs.append(log)
            port = free_port()
            started[label] = (start_server(env, root, port, args, server_env, log), port)
        for _server, port in started.values():
            load(port, WEBHOOK_PATH, connections, WARMUP_SECONDS)
        # Per server and pair: (ACK/s, CPU us per webhook, p99 ms, ratio to the ceiling).
        figures: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in started}
        print(
            f"\ninterleaved, {connections} connections, {args.interleave_seconds:g} s slices, "
            f"ceiling pgbench -M {args.ceiling_protocol} {args.ceiling_seconds:g} s"
        )
        ceilings = [ceiling(args, connections)]
        for pair in range(args.interleave):
            order = list(started) if pair % 2 == 0 else list(started)[::-1]
            slices = {}
            for label in order:
                server, port = started[label]
                workers = server_workers(server)
                rows_before, cpu_before = http_rows(), cpu_seconds(workers)
                slice_ = load(port, WEBHOOK_PATH, connections, args.interleave_seconds)
                cpu_used, rows = cpu_seconds(workers) - cpu_before, http_rows() - rows_before
                if rows < slice_["ok"]:
                    ok = False
                    print(f"  {label}: {slice_['ok']} 2xx but {rows} rows")
                slices[label] = (slice_, cpu_used)
            ceilings.append(ceiling(args, connections))
            pair_ceiling = (ceilings[-2] + ceilings[-1]) / 2
            for label, (slice_, cpu_used) in slices.items():
                rate = slice_["ok"] / slice_["seconds"]
                cpu_us = cpu_used / slice_["ok"] * 1e6 if slice_["ok"] else float("nan")
                figures[label].append((rate, cpu_us, slice_["p99_ms"], rate / pair_ceiling))
            base, new = figures["baseline"][-1], figures["current"][-1]
            print(
                f"  pair {pair + 1}: ceiling {pair_ceiling:.0f}/s; baseline {base[0]:.0f}/s "
                f"{base[1]:.0f} us p99 {base[2]:.1f} ms ({base[3]:.2f}); current {new[0]:.0f}/s "
                f"{new[1]:.0f} us p99 {new[2]:.1f} ms ({new[3]:.2f}): rate "
                f"{new[0] / base[0]:.3f}, CPU per webhook {new[1] / base[1]:.3f}",
                flush=True,
            )
        base_all, new_all = figures["baseline"], figures["current"]
        rates = [n[0] / b[0] for b, n in zip(base_all, new_all, strict=True)]
        cpus = [n[1] / b[1] for b, n in zip(base_all, new_all, strict=True)]
        print(
            f"current / baseline over {len(rates)} pairs: rate median "
            f"{statistics.median(rates):.3f} (higher in {sum(r > 1 for r in rates)}), "
            f"server CPU per webhook median "
            f"{statistics.median(cpus):.3f} (lower in {sum(c < 1 for c in cpus)})"
        )
        for label, mine in figures.items():
            print(
                f"{label}: ratio to the ceiling median {statistics.median(f[3] for f in mine):.2f}"
                f", ACK/s median {statistics.median(f[0] for f in mine):.0f}, p99 median "
                f"{statistics.median(f[2] for f in mine):.1f} ms, CPU per webhook median "
                f"{statistics.median(f[1] for f in mine):.0f} us"
            )
        print("rows: every 2xx is a row, in every slice" if ok else "rows: MISMATCH (above)")
    finally:
        for server, _ in started.values():
            stop(server)
        for log in logs:
            log.close()
    return ok


def print_header() -> None:
    print(
        f"{'server':<9}{'rnd':>4} {'endpoint':<8}{'conns':>6}{'slow':>5}{'2xx':>8}{'other':>6}"
        f"{'ACK/s':>8}{'p50':>8}{'p95':>8}{'p99':>8}{'max':>8}{'rows':>8}{'cpu us':>8}"
        f"{'steal%':>7}{'ceiling':>9}{'ratio':>7}"
    )


def print_phase(p: Phase) -> None:
    rows = "" if p.rows is None else str(p.rows)
    cpu = "" if p.server_cpu_us is None else f"{p.server_cpu_us:.0f}"
    steal = "" if p.steal_pct is None else f"{p.steal_pct:.0f}"
    paired = "" if p.ceiling is None else f"{p.ceiling:>9.0f}{p.ratio_to_ceiling:>7.2f}"
    print(
        f"{p.server:<9}{p.round:>4} {p.endpoint:<8}{p.connections:>6}{p.slow_clients:>5}"
        f"{p.ok:>8}{p.other:>6}{p.rate:>8.0f}{p.p50_ms:>8.2f}{p.p95_ms:>8.2f}{p.p99_ms:>8.2f}"
        f"{p.max_ms:>8.0f}{rows:>8}{cpu:>8}{steal:>7}{paired}",
        flush=True,
    )


def rows_verdict(phases: list[Phase]) -> tuple[bool, list[str]]:
    """Every 2xx a row; rows beyond the 2xx at most the requests in flight at the stop."""
    ok, lines = True, []
    for p in phases:
        if p.rows is None:
            continue
        in_flight = p.connections
        if p.rows < p.ok or p.rows - p.ok > in_flight:
            ok = False
            lines.append(
                f"MISMATCH {p.server} round {p.round} {p.connections} conns: {p.rows} rows for "
                f"{p.ok} 2xx (allowed: 2xx .. 2xx + {in_flight} in flight at the stop)"
            )
    return ok, lines


def summarize(phases, args) -> dict:
    """Per server and connections: the means of its webhook phases, and the ratio to the
    ceiling as the median of each phase's ratio to its own pair of ceilings (the VM's speed
    moves by tens of per cent within minutes: a ceiling measured once before the whole run
    and once after it moved the ratio of the same code from 0.53 to 0.30)."""

    def mean(values):
        values = list(values)
        return sum(values) / len(values) if values else float("nan")

    def median(values):
        values = list(values)
        return statistics.median(values) if values else float("nan")

    ceiling = {
        c: mean(x for p in phases if p.connections == c for x in p.ceilings)
        for c in args.connections
    }
    summary: dict = {"ceiling_per_s": {str(c): v for c, v in ceiling.items()}, "servers": {}}
    for label in dict.fromkeys(p.server for p in phases):
        mine = [p for p in phases if p.server == label]
        per: dict = {}
        for c in args.connections:
            hooks = [
                p
                for p in mine
                if p.endpoint == "webhook" and p.connections == c and not p.slow_clients
            ]
            noops = [p for p in mine if p.endpoint == "noop" and p.connections == c]
            ratios = [p.ratio_to_ceiling for p in hooks if p.ratio_to_ceiling is not None]
            ack = mean(p.rate for p in hooks)
            noop = mean(p.rate for p in noops)
            per[str(c)] = {
                "ack_per_s": ack,
                "p50_ms": mean(p.p50_ms for p in hooks),
                "p95_ms": mean(p.p95_ms for p in hooks),
                "p99_ms": mean(p.p99_ms for p in hooks),
                "noop_per_s": noop,
                "noop_p99_ms": mean(p.p99_ms for p in noops),
                "ceiling_per_s": mean(x for p in hooks for x in p.ceilings),
                "ratio_to_ceiling": median(ratios),
                "ratios_to_ceiling": ratios,
                "ratio_to_noop": ack / noop if noop else float("nan"),
            }
        slow = [p for p in mine if p.slow_clients]
        if slow:
            c = max(args.connections)
            with_slow = mean(p.rate for p in slow)
            per["slow_clients"] = {
                "count": args.slow_clients,
                "ack_per_s": with_slow,
                "p99_ms": mean(p.p99_ms for p in slow),
                "ratio_to_without": with_slow / per[str(c)]["ack_per_s"],
            }
        summary["servers"][label] = per
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, nargs="+", default=[16, 1])
    parser.add_argument("--seconds", type=float, default=10, help="per phase")
    parser.add_argument("--ceiling-seconds", type=float, default=10, help="per pgbench run")
    parser.add_argument(
        "--ceiling-protocol",
        choices=["prepared", "simple"],
        default="prepared",
        help="pgbench -M: how the ceiling's INSERT is sent (the store's way: prepared)",
    )
    parser.add_argument("--workers", type=int, default=2, help="web processes (WEB_CONCURRENCY)")
    parser.add_argument("--slow-clients", type=int, default=0, help="trickling at 1 B/s")
    parser.add_argument("--baseline", metavar="REV", help="also run the server of REV")
    parser.add_argument(
        "--current", metavar="REV", help="run the current server from REV, not the work tree"
    )
    parser.add_argument("--rounds", type=int, default=1, help="alternations with --baseline")
    parser.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="PAIRS",
        help="with --baseline: both servers up at once, wrk alternating in short slices",
    )
    parser.add_argument("--interleave-seconds", type=float, default=3, help="per slice")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--baseline-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="the same for the baseline server",
    )
    parser.add_argument("--client", choices=["wrk", "python"], default="wrk")
    parser.add_argument(
        "--otlp-sink",
        nargs="?",
        const="current",
        choices=["current", "baseline", "both"],
        help="tracing on in the current (or the baseline, or both) server, to a sink",
    )
    parser.add_argument(
        "--perf", action="store_true", help="with --py-spy: also Linux perf, into its DIR"
    )
    parser.add_argument("--json-out", metavar="FILE")
    parser.add_argument(
        "--py-spy", metavar="DIR", help="record the workers during the webhook phase"
    )
    args = parser.parse_args()
    if any(not 0 < c <= 256 for c in args.connections) or not 0 < args.seconds <= 300:
        parser.error("--connections must be 1..256, --seconds 1..300")
    if args.interleave and (not args.baseline or not 0 < args.interleave_seconds <= 60):
        parser.error("--interleave needs --baseline, and --interleave-seconds 1..60")
    if args.py_spy and not (VENV_BIN / "py-spy").exists():
        parser.error(f"--py-spy needs py-spy: {VENV_BIN / 'pip'} install py-spy")
    if args.perf and not (args.py_spy and shutil.which("perf")):
        parser.error("--perf needs --py-spy DIR and perf: apt-get install -y linux-perf")
    extra_env = dict(item.split("=", 1) for item in args.server_env)
    baseline_env = dict(item.split("=", 1) for item in args.baseline_env)
    sink = OtlpSink() if args.otlp_sink else None
    if sink is not None:
        for side, traced in (("current", extra_env), ("baseline", baseline_env)):
            if args.otlp_sink in (side, "both"):
                traced.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", sink.url)

    env = bench_env(f"{SERVER_URL}/{DB_NAME}")
    wrk = ensure_wrk() if args.client == "wrk" else None
    phases: list[Phase] = []
    with (
        tempfile.TemporaryDirectory(prefix="ingress_ack_") as workdir,
        ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool,
    ):
        current = revision_tree(args.current, workdir, "current") if args.current else ROOT
        facts = prepare_database(env, current)
        servers = [("current", current, extra_env)]
        if args.baseline:
            servers.insert(
                0, ("baseline", revision_tree(args.baseline, workdir, "baseline"), baseline_env)
            )
        load = Load(wrk, workdir, pool)
        print(
            f"\n{time.strftime('%Y-%m-%d %H:%M')}  {platform.node()}  {os.cpu_count()} CPUs  "
            f"Python {platform.python_version()}  PostgreSQL {facts['postgres']} "
            f"(synchronous_commit={facts['synchronous_commit']}, fsync={facts['fsync']})  "
            f"client {'wrk' if wrk else 'python'}  {args.workers} web processes  "
            + (
                f"{args.interleave} pairs of {args.interleave_seconds:g} s slices"
                if args.interleave
                else f"{args.seconds:g} s per phase  ceiling pgbench -M {args.ceiling_protocol}"
            )
            + (f"  current env {extra_env}" if extra_env else "")
        )
        psql(DB_NAME, "TRUNCATE ingress_rawevent")
        if args.interleave:
            ok = interleave(servers, env, args, load, workdir)
            if sink is not None:
                sides = "both servers" if args.otlp_sink == "both" else f"the {args.otlp_sink}"
                print(f"otlp sink: {sink.exports} exports from {sides}: {sink.spans}")
            return 0 if ok else 1
        print_header()
        for round_no in range(1, (args.rounds if args.baseline else 1) + 1):
            order = servers if round_no % 2 else servers[::-1]
            for label, root, server_env in order:
                phases += measure_server(
                    label, round_no, root, server_env, env, args, load, workdir
                )

    summary = summarize(phases, args)
    ok, lines = rows_verdict(phases)
    print()
    for label, per in summary["servers"].items():
        for c in args.connections:
            s = per[str(c)]
            print(
                f"{label}, {c} connections: {s['ack_per_s']:.0f} ACK/s, p50/p95/p99 "
                f"{s['p50_ms']:.2f}/{s['p95_ms']:.2f}/{s['p99_ms']:.2f} ms; no-write "
                f"{s['noop_per_s']:.0f}/s; ceiling {s['ceiling_per_s']:.0f}/s; ratio to ceiling "
                f"{s['ratio_to_ceiling']:.2f} (median of "
                + ", ".join(f"{r:.2f}" for r in s["ratios_to_ceiling"])
                + f"), to no-write {s['ratio_to_noop']:.2f}"
            )
        if "slow_clients" in per:
            s = per["slow_clients"]
            print(
                f"{label}, {max(args.connections)} connections + {s['count']} slow clients: "
                f"{s['ack_per_s']:.0f} ACK/s (p99 {s['p99_ms']:.2f} ms), "
                f"{s['ratio_to_without']:.2f} of the figure without them"
            )
    if args.baseline:
        for c in args.connections:
            pairs = [
                (b.rate, n.rate)
                for b in phases
                for n in phases
                if b.server == "baseline"
                and n.server == "current"
                and b.round == n.round
                and b.endpoint == n.endpoint == "webhook"
                and b.connections == n.connections == c
                and not b.slow_clients
                and not n.slow_clients
            ]
            print(
                f"current / baseline, {c} connections, per round: "
                + ", ".join(f"{n / b:.2f}" for b, n in pairs if b)
            )
    print("\n".join(lines) or "rows: every 2xx is a row, in every phase")

    if args.json_out:
        c = max(args.connections)
        main_figures = summary["servers"]["current"][str(c)]
        Path(args.json_out).write_text(
            json.dumps(
                {
                    "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "connections": c,
                    "ack_per_s": main_figures["ack_per_s"],
                    "p50_ms": main_figures["p50_ms"],
                    "p95_ms": main_figures["p95_ms"],
                    "p99_ms": main_figures["p99_ms"],
                    "ceiling_per_s": main_figures["ceiling_per_s"],
                    "ceiling_protocol": args.ceiling_protocol,
                    "ratio_to_ceiling": main_figures["ratio_to_ceiling"],
                    "ratio_to_noop": main_figures["ratio_to_noop"],
                    "rows_ok": ok,
                    "facts": facts,
                    "summary": summary,
                    "phases": [asdict(p) for p in phases],
                },
                indent=2,
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
