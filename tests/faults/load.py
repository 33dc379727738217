"""Bounded webhook load from a separate process, for the fault suite.

    python tests/faults/load.py --port 8123 --out results.jsonl --duration 10 --concurrency 6

Each thread keeps one HTTP/1.1 connection (reopened after an error, as a provider's client
would) and POSTs signed GitHub-style webhooks, each with a body no other request has (its
sequence number, a random tag, and non-ASCII bytes, so an exact-bytes comparison means
something), pausing between requests so the load stays bounded. Every request becomes one
JSON line in `--out`: what was sent (the exact body, base64) and what came back (status,
Retry-After, Content-Type, the response text, wall-clock start and duration, or the client
error). It stops starting requests after `--duration` seconds, `--requests` requests or a
SIGTERM, whichever comes first, and exits 0 once every thread has finished its request.
Standard library only.
"""

import argparse
import base64
import hashlib
import hmac
import http.client
import itertools
import json
import secrets
import signal
import threading
import time
import uuid

PATH = "/webhooks/github/"


def signed_request(n: int, secret: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(
        {"zen": "Ünïcödé stays bytes — ✓", "n": n, "tag": secrets.token_hex(8)},
        ensure_ascii=False,
    ).encode()
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": str(uuid.uuid4()),
    }
    return body, headers


def run(args: argparse.Namespace) -> None:
    numbers = itertools.count()
    lock = threading.Lock()
    stop_at = time.monotonic() + args.duration
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    out = open(args.out, "a", encoding="utf-8")  # noqa: SIM115 (closed below)

    def record(line: dict) -> None:
        text = json.dumps(line)
        with lock:
            out.write(text + "\n")
            out.flush()

    def worker() -> None:
        conn: http.client.HTTPConnection | None = None
        while time.monotonic() < stop_at and not stopping.is_set():
            with lock:
                n = next(numbers)
            if n >= args.requests:
                break
            body, headers = signed_request(n, args.secret)
            line = {"n": n, "body_b64": base64.b64encode(body).decode(), "started": time.time()}
            started = time.monotonic()
            try:
                reused = conn is not None
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=args.timeout)
                try:
                    conn.request("POST", PATH, body=body, headers=headers)
                    response = conn.getresponse()
                except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                    if not reused:
                        raise
                    # The server closed the kept-alive connection before this request (it
                    # may, after a 503): sent again on a new one, as HTTP clients do.
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=args.timeout)
                    conn.request("POST", PATH, body=body, headers=headers)
                    response = conn.getresponse()
                text = response.read().decode("utf-8", "replace")
                line.update(
                    status=response.status,
                    retry_after=response.getheader("Retry-After"),
                    content_type=response.getheader("Content-Type"),
                    response=text,
                )
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as exc:
                line.update(status=None, error=f"{type(exc).__name__}: {exc}")
                if conn is not None:
                    conn.close()
                conn = None
            line["seconds"] = time.monotonic() - started
            record(line)
            time.sleep(args.pause)
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True, help="JSON lines, appended")
    parser.add_argument("--secret", default="It's a Secret to Everybody")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    parser.add_argument("--requests", type=int, default=10_000, help="at most this many")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between requests")
    parser.add_argument("--timeout", type=float, default=30.0, help="client socket timeout")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
