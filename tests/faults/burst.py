"""A bounded burst of signed webhooks across sources, from a separate process (topology test).

    python tests/faults/burst.py --ports 8001,8002 --events 5000 --recaps recaps.json \\
        --out summary.json --concurrency 8 --rate 500 --deadline 150

Every logical event is sent until it gets a 202, as a provider retries: the same body and
headers again after a connection error or a 503 (so a request whose 202 was lost with a
killed server arrives twice, and the inbox's dedup must make it one event), alternating
between the web servers. Sources: GitHub `ping`, Slack `event_callback`, Stripe
`customer.created`, and one Stripe `checkout.session.completed` (paid) per recap id in
`--recaps`, spread through the burst. With `--rate`, the n-th event is not sent before
n / rate seconds into the burst, so a fast machine does not finish it sooner than that.
Secrets from the environment (the test secrets). Writes a JSON summary: per kind, events sent
and acknowledged, and every event that never got a 202 before the deadline. Standard library
only.
"""

import argparse
import hashlib
import hmac
import http.client
import itertools
import json
import os
import threading
import time
import uuid


def github(n: int) -> tuple[str, str, bytes, dict[str, str]]:
    body = json.dumps({"zen": "topology", "n": n}).encode()
    digest = hmac.new(os.environ["GITHUB_WEBHOOK_SECRET"].encode(), body, hashlib.sha256)
    return (
        "github",
        f"gh-{n}",
        body,
        {
            "X-Hub-Signature-256": f"sha256={digest.hexdigest()}",
            "X-GitHub-Event": "ping",
            "X-GitHub-Delivery": str(uuid.uuid5(uuid.NAMESPACE_URL, f"topology/{n}")),
        },
    )


def slack(n: int) -> tuple[str, str, bytes, dict[str, str]]:
    body = json.dumps(
        {"type": "event_callback", "event_id": f"EvTopo{n:08d}", "event": {"type": "message"}}
    ).encode()
    timestamp = str(int(time.time()))
    digest = hmac.new(
        os.environ["SLACK_SIGNING_SECRET"].encode(),
        f"v0:{timestamp}:".encode() + body,
        hashlib.sha256,
    )
    return (
        "slack",
        f"ev-{n}",
        body,
        {
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": f"v0={digest.hexdigest()}",
        },
    )


def stripe(event_id: str, event_type: str, data: dict) -> tuple[str, str, bytes, dict]:
    body = json.dumps(
        {"id": event_id, "object": "event", "type": event_type, "data": {"object": data}}
    ).encode()
    timestamp = int(time.time())
    digest = hmac.new(
        os.environ["STRIPE_WEBHOOK_SECRET"].encode(),
        f"{timestamp}.".encode() + body,
        hashlib.sha256,
    )
    return "stripe", event_id, body, {"Stripe-Signature": f"t={timestamp},v1={digest.hexdigest()}"}


def plan(events: int, recaps: list[str]) -> list[tuple[str, int | str]]:
    """Which event comes when: paid recaps evenly spread among the others."""
    kinds = itertools.cycle(["github", "slack", "stripe"])
    order: list[tuple[str, int | str]] = [(next(kinds), n) for n in range(events)]
    step = max(1, events // (len(recaps) + 1))
    for index, recap_id in enumerate(recaps):
        order.insert(min(len(order), (index + 1) * step + index), ("paid", recap_id))
    return order


def build(kind: str, key: int | str):
    if kind == "github":
        return github(int(key))
    if kind == "slack":
        return slack(int(key))
    if kind == "stripe":
        return stripe(f"evt_topo_{key}", "customer.created", {"id": f"cus_{key}"})
    return stripe(
        f"evt_paid_{key}",
        "checkout.session.completed",
        {
            "id": f"cs_{key}",
            "payment_status": "paid",
            "payment_intent": f"pi_{key}",
            "metadata": {"recap_id": key},
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ports", required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--recaps", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rate", type=float, help="at most this many new events a second")
    parser.add_argument("--deadline", type=float, default=150.0)
    args = parser.parse_args()
    ports = [int(port) for port in args.ports.split(",")]
    with open(args.recaps) as recaps_file:
        recaps = json.load(recaps_file)
    work = iter(enumerate(plan(args.events, recaps)))
    lock = threading.Lock()
    stop_at = time.monotonic() + args.deadline
    summary: dict = {"sent": {}, "acked": {}, "attempts": 0, "failed": [], "seconds": 0.0}
    started = time.monotonic()

    def sender(index: int) -> None:
        connection: http.client.HTTPConnection | None = None
        turn = index
        while True:
            with lock:
                item = next(work, None)
            if item is None:
                break
            index, (kind, key) = item
            if args.rate:
                time.sleep(max(0.0, started + index / args.rate - time.monotonic()))
            with lock:
                summary["sent"][kind] = summary["sent"].get(kind, 0) + 1
            source, name, body, headers = build(kind, key)
            while time.monotonic() < stop_at:
                turn += 1
                port = ports[turn % len(ports)]
                try:
                    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                    connection.request(
                        "POST",
                        f"/webhooks/{source}/",
                        body=body,
                        headers={"Content-Type": "application/json", **headers},
                    )
                    response = connection.getresponse()
                    response.read()
                    status = response.status
                except (OSError, http.client.HTTPException):
                    status = None
                finally:
                    if connection is not None:
                        connection.close()
                with lock:
                    summary["attempts"] += 1
                if status == 202:
                    with lock:
                        summary["acked"][kind] = summary["acked"].get(kind, 0) + 1
                    break
                if status is not None and status not in (502, 503):
                    with lock:
                        summary["failed"].append([kind, name, status])
                    break
                time.sleep(0.2)
            else:
                with lock:
                    summary["failed"].append([kind, name, "deadline"])

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(args.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary["seconds"] = round(time.monotonic() - started, 1)
    with open(args.out, "w") as out:
        json.dump(summary, out)


if __name__ == "__main__":
    main()
