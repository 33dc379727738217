"""Benchmark: how fast the webhook endpoint acknowledges (one durable INSERT, then 202).

Not a test. It needs PostgreSQL on 127.0.0.1:5432 and uses its own database
(`eventdrop_bench`), which it creates and migrates if needed and empties before each run.
It starts the real app bound to 127.0.0.1 on a free port — by default under the production
server exactly as the Procfile starts it (`python -m eventdrop.web`: granian, eventdrop/web.py),
or under gunicorn (gthread workers, keep-alive) or granian's own WSGI mode for comparison —
with bench/settings_bench.py, whose URLconf adds a trivial view that reads the body and
answers 202 without writing anything. A second process then fires signed-looking Stripe
POSTs (a realistic ~1.5 KiB `checkout.session.completed` body, a `Stripe-Signature` header)
over keep-alive connections at the given concurrency, first at `/webhooks/stripe/`, then the
same number at the trivial view, and reports ACK/s and p50/p95/p99 latency of both and their
ratio. Afterwards it checks that the rows stored equal the 202s the webhook answered.

    .venv/bin/python bench/ingress_ack.py --requests 5000 --concurrency 16 --workers 2
    .venv/bin/python bench/ingress_ack.py --server gunicorn   # the server before issue 8

`--slow-clients N` keeps N more connections trickling a webhook body at 1 byte/s during
both phases (reconnecting whenever one is cut off), to see what they cost everybody else.

Client and server share the machine, so the figures are a floor for the server alone.
Everything listens on 127.0.0.1 only, and everything it started is stopped at the end.
"""

import argparse
import http.client
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
DB_NAME = "eventdrop_bench"
SERVER_URL = "postgres://postgres@127.0.0.1:5432"
WEBHOOK_PATH = "/webhooks/stripe/"
NOOP_PATH = "/bench/noop/stripe/"
MAX_REQUESTS = 200_000
WARMUP_REQUESTS = 200
REQUEST_TIMEOUT_SECONDS = 10
SERVER_START_SECONDS = 30

# A Stripe `checkout.session.completed` event as Stripe sends it (~1.5 KiB); the id and the
# timestamp change per request so no two bodies are the same.
BODY_TEMPLATE = (
    '{{"id": "evt_{n:024d}", "object": "event", "api_version": "2024-06-20", '
    '"created": {ts}, "data": {{"object": {{"id": "cs_test_{n:058d}", '
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
    '"mode": "payment", "payment_intent": "pi_3PqRsTuVwXyZ{n:012d}", '
    '"payment_method_types": ["card", "sepa_debit"], "payment_status": "paid", '
    '"shipping_details": null, "status": "complete", '
    '"success_url": "https://eventdrop.example/recaps/thanks", "total_details": '
    '{{"amount_discount": 0, "amount_shipping": 0, "amount_tax": 0}}, "url": null}}}}, '
    '"livemode": false, "pending_webhooks": 1, "request": {{"id": null, '
    '"idempotency_key": null}}, "type": "checkout.session.completed"}}'
)


@dataclass
class Phase:
    name: str
    path: str
    statuses: dict[int, int]
    latencies_ms: list[float]
    errors: int
    seconds: float

    @property
    def ok(self) -> int:
        return self.statuses.get(202, 0)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return float("nan")
        rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
        return ordered[rank]


# --- the load generator (runs in a second process) -----------------------------------------


def fire(port: int, path: str, requests: int, concurrency: int, deadline: float) -> dict:
    """POST `requests` bodies to `path` from `concurrency` keep-alive connections."""
    lock = threading.Lock()
    issued = 0
    statuses: dict[int, int] = {}
    latencies: list[float] = []
    errors = 0

    def worker() -> None:
        nonlocal issued, errors
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT_SECONDS)
        try:
            while time.monotonic() < deadline:
                with lock:
                    if issued >= requests:
                        return
                    issued += 1
                    n = issued
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
                except (OSError, http.client.HTTPException):
                    conn.close()  # http.client reconnects on the next request
                    with lock:
                        errors += 1
                        # A timeout is a latency too: leaving it out would flatter the p99.
                        latencies.append((time.perf_counter() - started) * 1000)
                    continue
                elapsed = (time.perf_counter() - started) * 1000
                with lock:
                    statuses[response.status] = statuses.get(response.status, 0) + 1
                    latencies.append(elapsed)
        finally:
            conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "statuses": statuses,
        "latencies_ms": latencies,
        "errors": errors,
        "seconds": time.perf_counter() - started,
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

    def start(self) -> None:
        for thread in self.threads:
            thread.start()
        time.sleep(2 if self.count else 0)  # all of them connected and mid-body

    def stop(self) -> None:
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


# --- orchestration -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_env(database_url: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "DATABASE_", "WEBHOOK_"))
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
        PYTHONPATH=str(ROOT),
    )
    return env


def psql(database: str, *statements: str) -> list:
    import psycopg

    with psycopg.connect(f"{SERVER_URL}/{database}", autocommit=True) as conn:
        rows: list = []
        for statement in statements:
            cursor = conn.execute(statement)
            rows = cursor.fetchall() if cursor.description else []
        return rows


def prepare_database(env: dict[str, str]) -> dict[str, str]:
    if not psql("postgres", "SELECT 1 FROM pg_database WHERE datname = 'eventdrop_bench'"):
        psql("postgres", f"CREATE DATABASE {DB_NAME}")
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run(
        [*manage, "migrate", "--noinput", "--skip-checks", "-v0"], env=env, cwd=ROOT, check=True
    )
    # As in production: today's partition exists, rows do not land in the DEFAULT partition.
    subprocess.run(
        [*manage, "raw_event_partitions", "--skip-checks"],
        env=env,
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    psql(DB_NAME, "TRUNCATE ingress_rawevent")
    facts = psql(
        DB_NAME,
        "SELECT current_setting('server_version'), current_setting('synchronous_commit'), "
        "current_setting('fsync')",
    )[0]
    return {"postgres": facts[0], "synchronous_commit": facts[1], "fsync": facts[2]}


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    if args.server == "gunicorn":
        return [
            str(VENV_BIN / "gunicorn"),
            "eventdrop.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(args.workers),
            "--worker-class",
            args.worker_class,
            "--threads",
            str(args.threads),
            "--keep-alive",
            "30",
            "--timeout",
            "30",
            "--log-level",
            "warning",
        ]
    if args.server == "granian-wsgi":  # granian's own WSGI mode, for comparison
        return [
            str(VENV_BIN / "granian"),
            "--interface",
            "wsgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(args.workers),
            "--blocking-threads",
            str(args.threads),
            "--no-ws",
            "--log-level",
            "warning",
            "eventdrop.wsgi:application",
        ]
    # The production server, as the Procfile starts it (eventdrop/web.py).
    return [sys.executable, "-m", "eventdrop.web"]


def start_server(env: dict[str, str], port: int, args: argparse.Namespace, log) -> subprocess.Popen:
    command = server_command(args, port)
    env = {
        **env,
        "PORT": str(port),
        "WEB_BIND": "127.0.0.1",
        "WEB_CONCURRENCY": str(args.workers),
        "WEB_THREADS": str(args.threads),
        "WEB_LOG_LEVEL": "warning",
    }
    server = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=log, stderr=log, start_new_session=True
    )
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"{args.server} exited with {server.returncode}; see {log.name}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", WEBHOOK_PATH)
            if conn.getresponse().status == 405:  # the app answers: ready
                conn.close()
                return server
        except OSError:
            time.sleep(0.2)
    stop(server)
    raise RuntimeError(f"{args.server} did not answer in {SERVER_START_SECONDS}s; see {log.name}")


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)  # its own session: master and workers
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def run_phase(pool, name: str, path: str, port: int, args, deadline: float) -> Phase:
    raw = pool.submit(fire, port, path, args.requests, args.concurrency, deadline).result()
    return Phase(name=name, path=path, **raw)


def report(
    phases: list[Phase], args, facts: dict[str, str], stored: int, acked: int, slow: dict
) -> None:
    print(
        f"\n{time.strftime('%Y-%m-%d')}  {platform.node()}  {os.cpu_count()} CPUs  "
        f"Python {platform.python_version()}  PostgreSQL {facts['postgres']} "
        f"(synchronous_commit={facts['synchronous_commit']}, fsync={facts['fsync']})"
    )
    shape = {
        "granian": "granian ASGI + eventdrop.web (the Procfile's)",
        "gunicorn": f"gunicorn {args.worker_class}",
        "granian-wsgi": "granian WSGI",
    }[args.server]
    print(
        f"{shape} x{args.workers} processes x{args.threads} threads; "
        f"{args.requests} requests per endpoint at concurrency {args.concurrency}, keep-alive"
        + (f"; {args.slow_clients} slow clients at 1 B/s" if args.slow_clients else "")
        + "\n"
    )
    print(
        f"{'endpoint':<22}{'2xx':>7}{'other':>7}{'ACK/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
        f"{'max ms':>9}"
    )
    for phase in phases:
        other = sum(v for k, v in phase.statuses.items() if k != 202) + phase.errors
        print(
            f"{phase.path:<22}{phase.ok:>7}{other:>7}{phase.rate:>9.0f}"
            f"{phase.percentile(50):>9.2f}{phase.percentile(95):>9.2f}{phase.percentile(99):>9.2f}"
            f"{phase.percentile(100):>9.0f}"
        )
    webhook, noop = phases
    if noop.rate and webhook.latencies_ms and noop.latencies_ms:
        print(
            f"\nwebhook / trivial view: throughput {webhook.rate / noop.rate:.2f}x, "
            f"p50 {webhook.percentile(50) / noop.percentile(50):.2f}x, "
            f"p99 {webhook.percentile(99) / noop.percentile(99):.2f}x"
        )
    else:
        print("\nwebhook / trivial view: no ratio, an endpoint answered nothing")
    if args.slow_clients:
        print(f"slow clients' answers: {dict(sorted(slow.items()))}")
    if stored == acked:
        verdict = "OK"
    elif stored > acked:  # stored, then the client gave up waiting: it retries, dedup copes
        verdict = f"OK, {stored - acked} stored but answered after the client's timeout"
    else:
        verdict = "MISMATCH: a 202 without its row"
    print(f"rows stored {stored}, 202s answered by the webhook {acked} (with warm-up): {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="per endpoint")
    parser.add_argument("--concurrency", type=int, default=16, help="client connections")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="processes")
    parser.add_argument("--threads", type=int, default=4, help="Django threads per process")
    parser.add_argument("--worker-class", default="gthread", choices=["gthread", "sync"])
    parser.add_argument(
        "--server", default="granian", choices=["granian", "gunicorn", "granian-wsgi"]
    )
    parser.add_argument("--slow-clients", type=int, default=0, help="trickling at 1 B/s")
    parser.add_argument("--max-seconds", type=float, default=300, help="bound on the load")
    args = parser.parse_args()
    if not 0 < args.requests <= MAX_REQUESTS or not 0 < args.concurrency <= 256:
        parser.error(f"--requests must be 1..{MAX_REQUESTS}, --concurrency 1..256")

    env = bench_env(f"{SERVER_URL}/{DB_NAME}")
    facts = prepare_database(env)
    port = free_port()
    with (
        tempfile.NamedTemporaryFile(
            "w", prefix=f"ingress_ack_{args.server}_", suffix=".log"
        ) as log,
        ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool,
    ):
        server = start_server(env, port, args, log)
        slow = SlowClients(port, args.slow_clients)
        try:
            deadline = time.monotonic() + args.max_seconds
            warm_acked = 0
            for path in (WEBHOOK_PATH, NOOP_PATH):  # warm both: imports, connections
                warm = pool.submit(fire, port, path, WARMUP_REQUESTS, args.concurrency, deadline)
                if path == WEBHOOK_PATH:
                    warm_acked = warm.result()["statuses"].get(202, 0)
                warm.result()
            slow.start()
            phases = [
                run_phase(pool, "webhook", WEBHOOK_PATH, port, args, deadline),
                run_phase(pool, "trivial view", NOOP_PATH, port, args, deadline),
            ]
        finally:
            slow.stop()
            stop(server)
    # Warm-up included: every 202 the webhook ever answered in this run must be a row.
    stored = psql(DB_NAME, "SELECT count(*) FROM ingress_rawevent")[0][0]
    acked = warm_acked + phases[0].ok
    report(phases, args, facts, stored=stored, acked=acked, slow=slow.answers)
    return 0 if stored >= acked else 1


if __name__ == "__main__":
    sys.exit(main())
