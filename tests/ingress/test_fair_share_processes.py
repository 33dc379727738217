"""Fair shares and limits on real processes (issue 41): `process_inbox` workers, a real HTTP
downstream for the limited handler (a server in this process, its answers recorded), the
events stored through the store service.

- Flood: junk 1 MB bodies on the Stripe source (a made-up signature: anyone can send them),
  then a signed GitHub ping a second while two workers drain them: each ping waits for a
  batch or two of junk, never for the drain.
- Limits: a handler declared at 20 a second and 4 at once, its events replayed in bulk by six
  workers: the downstream sees at most 20 a second in every 10 s window (±10 %), never more
  than 4 at once; another handler's fresh events are handled while the replay goes on.
- 429: the downstream answers 429 for a while: the handler slows, no row is charged, and
  every event is handled once after it recovers.

The sizes are the suite's; the issue's own (6,000 junk bodies, a 5,000-event replay, 429s
for 30 s) are set by FAIR_SHARE_JUNK, FAIR_SHARE_REPLAY and FAIR_SHARE_429_SECONDS, their
figures in docs/benchmarks.md ("Fair shares and limits").
"""

import json
import os
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ingress.models import Delivery, DeliveryAttempt, HandlerPace, RawEvent
from tests.ingress.paced.marks import CONCURRENCY, FRESH, PACED, PACED_HANDLER, RATE
from tests.ingress.test_fair_share import store, store_junk
from tests.support.processes import app_env, manage, settings_database_url, start_manage, wait_until
from tests.support.signing import github_headers

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MIB = 1024 * 1024


class Downstream(ThreadingHTTPServer):
    """The limited handler's downstream: records each call's arrival, how many ran at once,
    and answers 429 (Retry-After) inside a window of time."""

    daemon_threads = True

    def __init__(self, *, seconds: float):
        super().__init__(("127.0.0.1", 0), _DownstreamHandler)
        self.seconds = seconds
        self.lock = threading.Lock()
        self.arrivals: list[float] = []  # successful calls
        self.ids: list[int] = []
        self.limited_answers = 0
        self.running = 0
        self.most_at_once = 0
        self.limit_from: float | None = None  # monotonic seconds: 429 in [from, until)
        self.limit_until = 0.0
        self.retry_after = "2"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/calls"


class _DownstreamHandler(BaseHTTPRequestHandler):
    server: Downstream

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        downstream, now = self.server, time.monotonic()
        with downstream.lock:
            if downstream.limit_from is not None and (
                downstream.limit_from <= now < downstream.limit_until
            ):
                downstream.limited_answers += 1
                self.send_response(429)
                self.send_header("Retry-After", downstream.retry_after)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            downstream.running += 1
            downstream.most_at_once = max(downstream.most_at_once, downstream.running)
        time.sleep(downstream.seconds)
        with downstream.lock:
            downstream.running -= 1
            downstream.arrivals.append(now)
            downstream.ids.append(body["raw_event_id"])
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def downstream():
    server = Downstream(seconds=0.1)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def worker_env(downstream: Downstream | None = None, **extra: str) -> dict[str, str]:
    return app_env(
        settings_database_url(),
        DJANGO_SETTINGS_MODULE="tests.ingress.paced.settings",
        INBOX_IDLE_SLEEP_SECONDS="0.1",
        LOG_LEVEL="WARNING",
        PACED_DOWNSTREAM_URL=downstream.url if downstream else "http://127.0.0.1:9/",
        **extra,
    )


def store_github(event_type: str, n: int, *, tag: str) -> RawEvent:
    body = json.dumps({"n": n, "tag": tag}).encode()
    headers = github_headers(body, event=event_type, delivery=f"{tag}-{n}")
    return store(
        "github", body, {key[5:].replace("_", "-").lower(): value for key, value in headers.items()}
    )


# Verify the stored events (the limited handler's deliveries wait for the claim), finish its
# deliveries as if handled long ago, then replay them in a bulk job's batches.
_VERIFY_FINISH_REPLAY = """
from ingress.inbox import raw_events_verify_batch
from ingress.models import Delivery, RawEvent
from ingress.services import raw_events_replay_batch
while raw_events_verify_batch():
    pass
Delivery.objects.filter(handler="{handler}").update(status="done")
ids = sorted(RawEvent.objects.filter(event_type="{event_type}").values_list("id", flat=True))
for start in range(0, len(ids), 500):
    raw_events_replay_batch(raw_event_ids=ids[start:start + 500])
"""


def replay_paced(count: int, env: dict[str, str]) -> None:
    for n in range(count):
        store_github(PACED, n, tag="paced")
    manage(
        "shell", "-c", _VERIFY_FINISH_REPLAY.format(handler=PACED_HANDLER, event_type=PACED),
        env=env, timeout=300,
    )
    assert Delivery.objects.filter(handler=PACED_HANDLER, status="pending").count() == count


def paced_counts() -> dict[str, int]:
    return {
        status: Delivery.objects.filter(handler=PACED_HANDLER, status=status).count()
        for status in ("pending", "processing", "done", "dead")
    }


def most_in_any_window(arrivals: list[float], seconds: float) -> int:
    ordered = sorted(arrivals)
    most, start = 0, 0
    for end, at in enumerate(ordered):
        while ordered[start] <= at - seconds:
            start += 1
        most = max(most, end - start + 1)
    return most


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Sender(threading.Thread):
    """Stores one signed GitHub event every `every` seconds until stopped."""

    def __init__(self, event_type: str, *, every: float, tag: str):
        super().__init__(daemon=True)
        self.event_type, self.every, self.tag = event_type, every, tag
        self.sent: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.stopping.wait(self.every):
                self.sent.append(store_github(self.event_type, len(self.sent), tag=self.tag).id)
        finally:
            connection.close()


def test_a_junk_flood_on_one_source_delays_the_others_by_a_batch_not_the_drain(tmp_path):
    junk_count = int(os.environ.get("FAIR_SHARE_JUNK", "300"))
    junk = store_junk(junk_count, size=MIB - 64)
    env = worker_env()
    workers = [start_manage(["process_inbox"], env, log=tmp_path / f"w{n}.log") for n in (1, 2)]
    pings = Sender("ping", every=0.25, tag="ping")
    pings.start()
    junk_ids = [event.id for event in junk]
    try:
        wait_until(
            lambda: not RawEvent.objects.filter(id__in=junk_ids, signature_status="pending")
            .exists(),
            "the junk drained",
            lambda: RawEvent.objects.filter(signature_status="pending").count(),
            workers,
            timeout=600,
        )
        pings.stopping.set()
        pings.join()
        wait_until(
            lambda: not RawEvent.objects.filter(id__in=pings.sent, verified_at__isnull=True)
            .exists(),
            "every ping verified",
            lambda: len(pings.sent),
            workers,
        )
    finally:
        pings.stopping.set()
        for worker in workers:
            worker.stop()
    assert len(pings.sent) >= 5, "the drain outran the pings: a larger flood is needed"
    rows = [
        (received, verified)
        for received, verified in RawEvent.objects.filter(id__in=pings.sent).values_list(
            "received_at", "verified_at"
        )
        if verified is not None  # every one is: waited for above
    ]
    waits = [(verified - received).total_seconds() for received, verified in rows]
    junk_verified = sorted(
        at
        for at in RawEvent.objects.filter(id__in=junk_ids).values_list("verified_at", flat=True)
        if at is not None
    )
    # Junk verified while each ping waited: the batches in progress when it arrived and its
    # own (32 MiB each, about 32 bodies), not the backlog behind it.
    per_batch = 32
    behind = [
        sum(1 for at in junk_verified if received < at <= verified)
        for received, verified in rows
    ]
    print(
        f"{len(pings.sent)} pings during a {junk_count} x 1 MiB flood: wait p50 "
        f"{statistics.median(waits):.2f} s, p99 {percentile(waits, 0.99):.2f} s, most junk "
        f"verified meanwhile {max(behind)} (the drain: {junk_count})"
    )
    assert max(behind) <= 4 * per_batch, behind
    assert set(RawEvent.objects.filter(id__in=pings.sent).values_list("signature_status",
                                                                       flat=True)) == {"verified"}


def test_a_limited_handler_keeps_its_rate_and_concurrency_under_a_bulk_replay(
    downstream, tmp_path
):
    count = int(os.environ.get("FAIR_SHARE_REPLAY", "400"))
    env = worker_env(downstream)
    replay_paced(count, env)
    workers = [start_manage(["process_inbox"], env, log=tmp_path / f"w{n}.log") for n in range(6)]
    fresh = Sender(FRESH, every=0.5, tag="fresh")
    try:
        # The fresh events from when the workers run (not while they start).
        wait_until(lambda: bool(downstream.arrivals), "the replay under way", paced_counts, workers)
        fresh.start()
        wait_until(
            lambda: paced_counts()["done"] == count,
            "the replay done",
            paced_counts,
            workers,
            timeout=count / RATE * 3 + 60,
        )
        fresh.stopping.set()
        fresh.join()
        wait_until(
            lambda: not RawEvent.objects.filter(id__in=fresh.sent, handled_at__isnull=True)
            .exists(),
            "every fresh event handled",
            lambda: len(fresh.sent),
            workers,
        )
    finally:
        fresh.stopping.set()
        for worker in workers:
            worker.stop()
    assert sorted(downstream.ids) == sorted(
        RawEvent.objects.filter(event_type=PACED).values_list("id", flat=True)
    )  # once each
    windows = most_in_any_window(downstream.arrivals, 10.0)
    span = max(downstream.arrivals) - min(downstream.arrivals)
    waits = [
        (handled - received).total_seconds()
        for received, handled in RawEvent.objects.filter(id__in=fresh.sent).values_list(
            "received_at", "handled_at"
        )
        if handled is not None  # every one is: waited for above
    ]
    print(
        f"{count} replayed at {count / span:.1f}/s, most in a 10 s window {windows}, "
        f"at once {downstream.most_at_once}; {len(waits)} fresh events handled p50 "
        f"{statistics.median(waits):.2f} s, p99 {percentile(waits, 0.99):.2f} s"
    )
    assert windows <= RATE * 10 * 1.1, windows
    assert downstream.most_at_once <= CONCURRENCY
    assert downstream.most_at_once > 1  # the concurrency is used, not only kept
    # Fresh events did not wait for the replay: each was handled while paced ones waited.
    last_paced = max(downstream.arrivals)
    assert len(waits) >= 10
    assert max(waits) < span, (max(waits), span)
    assert last_paced > 0


def test_a_downstream_answering_429_slows_its_handler_and_charges_no_row(downstream, tmp_path):
    count = 150
    limited_seconds = float(os.environ.get("FAIR_SHARE_429_SECONDS", "12"))
    # The slow-down outlasts the 429s by seconds, not the production minute: what is asserted
    # is the rate while they last, then every row handled uncharged.
    env = worker_env(downstream, HANDLER_SLOWDOWN_SECONDS=str(limited_seconds / 2))
    replay_paced(count, env)
    workers = [start_manage(["process_inbox"], env, log=tmp_path / f"w{n}.log") for n in range(4)]
    try:
        wait_until(
            lambda: len(downstream.arrivals) >= 20,
            "the replay under way",
            paced_counts,
            workers,
        )
        with downstream.lock:
            downstream.limit_from = time.monotonic()
            downstream.limit_until = downstream.limit_from + limited_seconds
            done_before = len(downstream.arrivals)
        wait_until(
            lambda: paced_counts()["done"] == count,
            "every event handled after the 429s",
            paced_counts,
            workers,
            timeout=count / RATE * 3 + limited_seconds + 60,
        )
    finally:
        for worker in workers:
            worker.stop()
    limited_answers = downstream.limited_answers
    at_full_rate = RATE * limited_seconds
    print(
        f"{limited_answers} calls answered 429 in {limited_seconds:g} s "
        f"(at the full rate: {at_full_rate:g}); {done_before} handled before"
    )
    assert sorted(downstream.ids) == sorted(
        RawEvent.objects.filter(event_type=PACED).values_list("id", flat=True)
    )  # each once
    assert 0 < limited_answers <= at_full_rate / 4
    outcomes = set(
        DeliveryAttempt.objects.filter(delivery__handler=PACED_HANDLER).values_list(
            "outcome", flat=True
        )
    )
    assert outcomes == {"done", "released"}, outcomes  # never charged
    assert set(
        Delivery.objects.filter(handler=PACED_HANDLER).values_list("status", "attempts")
    ) == {("done", 1)}
    assert HandlerPace.objects.get(handler=PACED_HANDLER).rate_limited >= 1
