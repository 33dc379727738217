"""Benchmark: what encrypting bodies at rest (RAW_EVENT_ENCRYPTION_KEYS) costs per request.

Not a test. Two measurements, in one process, with plaintext and encrypted interleaved
round by round so both see the same machine:

1. `encrypt_body` alone (Fernet = AES-128-CBC + HMAC-SHA256, then the base64 decode) and
   `decrypt_body` (what the inbox and the console add per read), for bodies of 1 KiB,
   16 KiB and 1 MiB (the default body cap); then `encrypt_request` (body and 8 typical
   headers, what the receive path adds before its INSERT) and the decryption of both;
2. the whole store path, `raw_event_store` with its one INSERT and commit, on PostgreSQL
   (its own database `eventdrop_bench_encryption` on 127.0.0.1:5432, created and migrated on
   first use, emptied before each run), with a ~1 KiB body, encryption off and on.

    .venv/bin/python bench/encryption_at_rest.py --calls 1000 --rounds 3
"""

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "eventdrop_bench_encryption" + os.environ.get("EVENTDROP_BENCH_DB_SUFFIX", "")
SERVER_URL = "postgres://postgres@127.0.0.1:5432"
SIZES = {"1 KiB": 1024, "16 KiB": 16 * 1024, "1 MiB": 1024 * 1024}


def prepare() -> None:
    import psycopg

    sys.path.insert(0, str(ROOT))  # this checkout's bench package
    from bench import reusable_database

    def migrate() -> None:
        for args in (["migrate", "--noinput", "--skip-checks", "-v0"],
                     ["raw_event_partitions", "--skip-checks"]):
            subprocess.run([sys.executable, "manage.py", *args], env=os.environ, cwd=ROOT,
                           check=True, capture_output=True)

    reusable_database(SERVER_URL, DB_NAME, migrate)
    with psycopg.connect(f"{SERVER_URL}/{DB_NAME}", autocommit=True) as conn:
        conn.execute("TRUNCATE ingress_rawevent CASCADE")


def timed(function, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter_ns()
        function()
        samples.append((time.perf_counter_ns() - started) / 1000)
    return sorted(samples)


def summary(samples: list[float]) -> str:
    p99 = samples[max(int(len(samples) * 0.99) - 1, 0)]
    return f"median {statistics.median(samples):8.1f} µs  p99 {p99:8.1f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.update(
        DATABASE_URL=f"{SERVER_URL}/{DB_NAME}",
        DJANGO_SETTINGS_MODULE="eventdrop.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        STRIPE_WEBHOOK_SECRET="whsec_bench_" + secrets.token_hex(16),
    )
    prepare()
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from cryptography.fernet import Fernet
    from django.conf import settings
    from django.db import close_old_connections

    from ingress.encryption import decrypt_body, decrypt_headers, encrypt_body, encrypt_request
    from ingress.services import raw_event_store
    from ingress.sources import all_sources

    key = Fernet.generate_key().decode()
    settings.RAW_EVENT_ENCRYPTION_KEYS = [key]
    print("encrypt_body / decrypt_body alone:")
    for label, size in SIZES.items():
        body = secrets.token_bytes(size)
        calls = args.calls if size < 1024 * 1024 else max(args.calls // 20, 20)
        stored, scheme = encrypt_body(body)
        enc = timed(lambda body=body: encrypt_body(body), calls)
        dec = timed(lambda s=stored, k=scheme: decrypt_body(s, k), calls)
        print(f"  {label:6} encrypt {summary(enc)}   decrypt {summary(dec)}"
              f"   stored {len(stored) - size:+d} bytes")

    # What the receive path really calls: the body and the headers, under one key.
    request_headers = {"content-type": "application/json", "user-agent": "Stripe/1.0",
                       "stripe-signature": "t=1700000000,v1=" + "0" * 64 + ",v0=" + "0" * 64,
                       "content-length": "1024", "accept": "*/*; q=0.5, application/xml",
                       "cache-control": "no-cache", "host": "hooks.example.com",
                       "x-forwarded-for": "203.0.113.7"}
    body = secrets.token_bytes(1024)
    stored_body, stored_headers, scheme = encrypt_request(body, request_headers)
    enc = timed(lambda: encrypt_request(body, request_headers), args.calls)
    dec = timed(lambda: (decrypt_body(stored_body, scheme),
                         decrypt_headers(stored_headers, scheme)), args.calls)
    print(f"  1 KiB + 8 headers: encrypt_request {summary(enc)}   decrypt both {summary(dec)}")

    source = all_sources()["stripe"]
    headers = {"content-type": "application/json", "stripe-signature": "t=1,v1=00"}
    body = b'{"id": "evt_bench", "type": "checkout.session.completed", "p": "' + b"x" * 950 + b'"}'

    def store() -> None:
        close_old_connections()  # request_started
        raw_event_store(source=source, method="POST", path="/webhooks/stripe/",
                        query_string="", headers=headers, body=body, remote_addr="127.0.0.1")
        close_old_connections()  # request_finished

    print("raw_event_store (one INSERT + commit), ~1 KiB body:")
    medians: dict[str, list[float]] = {"plaintext": [], "encrypted": []}
    timed(store, 200)  # warm-up: connection, statement cache, partition
    for round_number in range(args.rounds):
        order = ("plaintext", "encrypted") if round_number % 2 == 0 else ("encrypted", "plaintext")
        for variant in order:
            settings.RAW_EVENT_ENCRYPTION_KEYS = [key] if variant == "encrypted" else []
            samples = timed(store, args.calls)
            medians[variant].append(statistics.median(samples))
            print(f"  round {round_number + 1} {variant:9}: {summary(samples)}")
    # Per round, so a slow stretch of the shared machine hits both variants of a pair.
    ratios = [e / p for p, e in zip(medians["plaintext"], medians["encrypted"], strict=True)]
    print("encrypted / plaintext per round: " + ", ".join(f"{r:.3f}" for r in ratios)
          + f"; median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
