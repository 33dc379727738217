"""A burst of signed webhooks against a running `make run` (SQLite), and how long until the
inbox worker has verified every one of them.

    .venv/bin/python bench/sqlite_burst.py --count 60 --concurrency 8

Reads the checkout's configuration like any manage.py command (.env): PORT, the GitHub
secret and the database. Reports the ACK time of the burst, each event's verification lag
(received_at -> verified_at) as p50/max, and the wall time from the first request to the
last verdict. Not a test: run it by hand, figures go to docs/benchmarks.md.
"""

import argparse
import hashlib
import hmac
import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventdrop.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from ingress.models import RawEvent  # noqa: E402


def send(url: str, secret: str, marker: str, n: int) -> int:
    body = json.dumps({"zen": f"burst {marker} {n}"}).encode()
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    response = requests.post(
        url,
        data=body,
        headers={
            "Content-Type": "application/json",
            "X-Hub-Signature-256": f"sha256={signature}",
            "X-GitHub-Event": "ping",
            "X-GitHub-Delivery": str(uuid.uuid4()),
        },
        timeout=(2, 10),
    )
    return response.status_code


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    url = f"http://127.0.0.1:{os.environ.get('PORT') or 8000}/webhooks/github/"
    secret = os.environ["GITHUB_WEBHOOK_SECRET"].split(",")[0]
    marker = uuid.uuid4().hex[:8]
    first_id = RawEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0

    started = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        statuses = list(pool.map(lambda n: send(url, secret, marker, n), range(args.count)))
    acked = time.monotonic()
    ours = RawEvent.objects.filter(id__gt=first_id, source="github")
    deadline = started + args.timeout
    while time.monotonic() < deadline and ours.filter(verified_at__isnull=True).exists():
        time.sleep(0.05)
    done = time.monotonic()
    lags = [
        (verified - received).total_seconds()
        for received, verified in ours.values_list("received_at", "verified_at")
        if verified is not None
    ]
    print(
        f"database {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}: "
        f"{args.count} webhooks, {args.concurrency} at a time; answers "
        f"{ {s: statuses.count(s) for s in set(statuses)} } in {acked - started:.2f} s; "
        f"verified {len(lags)}/{args.count}, lag p50 {median(lags) if lags else 0:.2f} s, "
        f"max {max(lags) if lags else 0:.2f} s; first request to last verdict "
        f"{done - started:.2f} s"
    )
    return 0 if len(lags) == args.count and statuses.count(202) == args.count else 1


if __name__ == "__main__":
    sys.exit(main())
