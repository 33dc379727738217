"""One trace from Stripe's POST to `ready`, across real processes (issue 42).

The Procfile's web server, inbox, dispatcher and django-q2 worker, and the fake render service
(`manage.py run_fake_renderer`), each its own OS process, export OTLP over HTTP to a receiver
in this test (its own HTTP server, decoding opentelemetry-proto's ExportTraceServiceRequest:
no collector binary installs here). A paid recap must yield one trace whose spans, from four
processes at least, hang together parent by parent:

    webhook receive (web, Stripe's POST) → webhook verify (inbox) → webhook deliver (inbox)
    → recap paid (inbox) → render dispatch (dispatcher) → POST (requests) → fake render
    accept (renderer) … → webhook receive (web, the render callback, its echoed traceparent)
    → webhook verify → webhook deliver → recap ready (inbox)

Then the restart: the render service stops answering, the dispatcher is SIGKILLed while its
POST waits (claimed, its attempt unrecorded), a new one takes the row back once the dead
holder's heartbeat has lapsed, and its attempt joins the same recap's trace.
"""

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from outbox.models import RecapSideEffect
from recaps.models import RecapStatus, RecapVideo
from tests.recaps.factories import EventFactory, RecapFactory
from tests.support.processes import (
    Managed,
    app_env,
    free_port,
    settings_database_url,
    start_manage,
    start_procfile,
    wait_until,
)
from tests.support.signing import checkout_session_event, post_signed_stripe

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf in, spans kept as dicts."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self.lock:
                        self.spans.append(
                            {
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "attributes": attributes(span.attributes),
                                "links": [link.trace_id.hex() for link in span.links],
                                "process": resource.get("eventdrop.process"),
                                "pid": resource.get("process.pid"),
                            }
                        )

    def named(self, name: str, **wanted: object) -> list[dict[str, Any]]:
        with self.lock:
            return [
                span
                for span in self.spans
                if span["name"] == name
                and all(span["attributes"].get(key) == value for key, value in wanted.items())
            ]

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def attributes(pairs: Any) -> dict[str, Any]:
    found = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        found[pair.key] = getattr(pair.value, kind) if kind else None
    return found


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture
def fleet(tmp_path, receiver):
    """web, inbox, dispatcher, worker and the fake render service, tracing to `receiver`."""
    web_port, renderer_port = free_port(), free_port()
    env = app_env(
        settings_database_url(),
        WEB_CONCURRENCY="1",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG="1.0",
        OTEL_BSP_SCHEDULE_DELAY="200",
        RENDER_SERVICE_URL=f"http://127.0.0.1:{renderer_port}",
        RENDER_CALLBACK_URL=f"http://127.0.0.1:{web_port}/webhooks/renderer/",
        OUTBOX_IDLE_SLEEP_SECONDS="0.3",
        INBOX_IDLE_SLEEP_SECONDS="0.2",
        # A killed dispatcher's claim is taken back in about half a minute (the shortest the
        # holder check allows: past the worker loop's 30 s error pause and a beat).
        CLAIM_HOLDER_BEAT_SECONDS="1",
        CLAIM_HOLDER_TTL_SECONDS="32",
        RENDER_CONNECT_TIMEOUT_SECONDS="1",
        RENDER_READ_TIMEOUT_SECONDS="20",
        RENDER_TIMEOUT_SECONDS="25",
    )
    processes: dict[str, Managed] = {}

    def start(name: str, starter) -> Managed:
        processes[name] = starter(tmp_path / f"{name}.log")
        return processes[name]

    start("renderer", lambda log: start_manage(
        ["run_fake_renderer", "--port", str(renderer_port), "--complete-after", "0.2"], env, log
    ))
    start("web", lambda log: start_procfile("web", env, port=web_port, log=log))
    for kind in ("inbox", "dispatcher", "worker"):
        start(kind, lambda log, kind=kind: start_procfile(kind, env, log=log))
    try:
        processes["web"].wait_listening(web_port, timeout=60)
        processes["renderer"].wait_listening(renderer_port, timeout=30)
        yield {
            "web": f"http://127.0.0.1:{web_port}",
            "renderer": f"http://127.0.0.1:{renderer_port}",
            "env": env,
            "processes": processes,
            "start": start,
        }
    finally:
        for process in processes.values():
            process.stop()


def ancestors(span: dict, by_id: dict[str, dict]) -> list[dict]:
    chain = []
    while span["parent"] in by_id:
        span = by_id[span["parent"]]
        chain.append(span)
    return chain


def test_a_paid_recap_is_one_trace_from_stripes_post_to_ready(fleet, receiver):
    recap = RecapFactory.create(event=EventFactory.create())
    alive = list(fleet["processes"].values())
    post_signed_stripe(fleet["web"], checkout_session_event(str(recap.id)))

    def status() -> str:
        return RecapVideo.objects.get(pk=recap.pk).status

    wait_until(lambda: status() == RecapStatus.READY, "the recap ready", status, alive, 90)

    def chain_to_stripe() -> list[str]:
        """The names from `recap ready` up its exported parents (each process exports on
        its own schedule, so the chain fills in over a few seconds on a loaded machine)."""
        with receiver.lock:
            by_id = {span["span_id"]: span for span in receiver.spans}
        readies = receiver.named("recap ready")
        if not readies:
            return []
        return [span["name"] for span in [readies[0], *ancestors(readies[0], by_id)]]

    # Ten spans up to Stripe's receive, which has no parent.
    wait_until(
        lambda: len(chain_to_stripe()) >= 10 and chain_to_stripe()[-1] == "webhook receive",
        "the chain of spans exported", chain_to_stripe, alive, 30,
    )

    (stripe,) = receiver.named("webhook receive", **{"eventdrop.source": "stripe"})
    assert stripe["parent"] == ""  # Stripe sends no context: the trace starts here
    trace_id = stripe["trace_id"]
    assert stripe["attributes"]["http.response.status_code"] == 202
    in_trace = [span for span in receiver.spans if span["trace_id"] == trace_id]
    by_id = {span["span_id"]: span for span in in_trace}

    (ready,) = receiver.named("recap ready")
    assert ready["trace_id"] == trace_id
    # From `ready` back to Stripe's POST, one parent at a time.
    up = [ready, *ancestors(ready, by_id)]
    path = [span["name"] for span in up]
    hops = [
        "recap ready",
        "webhook deliver",
        "webhook verify",
        "webhook receive",  # the callback, under the traceparent it echoed
        "fake render callback",  # the renderer's span, under the render POST's context
        "render dispatch",
        "recap paid",
        "webhook deliver",
        "webhook verify",
        "webhook receive",  # Stripe's
    ]
    assert [name for name in path if name in hops] == hops, path
    assert up[-1]["span_id"] == stripe["span_id"]
    # The render POST (requests' client span, in the dispatcher) carried the context the
    # render service took the request under and echoed on its callback.
    (dispatch,) = receiver.named("render dispatch")
    assert dispatch["attributes"]["eventdrop.outcome"] == "done"
    callback_sent = next(span for span in up if span["name"] == "fake render callback")
    post = by_id[callback_sent["parent"]]
    assert (post["process"], post["parent"]) == ("dispatcher", dispatch["span_id"])
    (accept,) = receiver.named("fake render accept")
    assert (accept["process"], accept["parent"]) == ("run_fake_renderer", post["span_id"])
    processes = {by_id[span_id]["process"] for span_id in by_id}
    assert {"web", "inbox", "dispatcher", "run_fake_renderer"} <= processes, processes
    # Every webhook receive of the trace answered, every delivery ran once, and done.
    (callback,) = receiver.named("webhook receive", **{"eventdrop.source": "renderer"})
    assert callback["trace_id"] == trace_id
    row = RecapSideEffect.objects.get(recap=recap)
    assert row.traceparent.split("-")[1] == trace_id

    # The restart: the service stops answering; the dispatcher is killed while its POST
    # waits (claimed, nothing recorded); a new one takes the row back and joins the trace.
    second = RecapFactory.create(event=EventFactory.create())
    requests.post(f"{fleet['renderer']}/_control", json={"mode": "hang"}, timeout=5)
    post_signed_stripe(fleet["web"], checkout_session_event(str(second.id)))

    def claimed() -> str:
        row = RecapSideEffect.objects.filter(recap=second).first()
        return row.status if row else "none"

    wait_until(lambda: claimed() == "processing", "the render row claimed", claimed, alive, 60)
    time.sleep(0.5)  # its POST is on its way to a service that never answers
    fleet["processes"]["dispatcher"].kill()
    requests.post(f"{fleet['renderer']}/_control", json={"mode": "ok"}, timeout=5)
    alive = [p for name, p in fleet["processes"].items() if name != "dispatcher"]
    alive.append(fleet["start"]("dispatcher2", lambda log: start_procfile(
        "dispatcher", fleet["env"], log=log)))

    def second_status() -> str:
        return RecapVideo.objects.get(pk=second.pk).status

    wait_until(
        lambda: second_status() == RecapStatus.READY, "the second recap ready after the re-arm",
        second_status, alive, 120,
    )
    wait_until(
        lambda: len(receiver.named("recap ready")) == 2, "the second ready span exported",
        lambda: len(receiver.named("recap ready")), alive, 30,
    )
    (second_stripe,) = [
        span for span in receiver.named("webhook receive", **{"eventdrop.source": "stripe"})
        if span["trace_id"] != trace_id
    ]
    second_trace = second_stripe["trace_id"]
    dispatches = [
        span for span in receiver.named("render dispatch") if span["trace_id"] == second_trace
    ]
    # The killed attempt exported nothing; the attempt after the re-arm is in the trace,
    # under the same `recap paid` span as the killed one was.
    assert dispatches, [span["name"] for span in receiver.spans if span["trace_id"] == second_trace]
    assert {span["process"] for span in dispatches} == {"dispatcher"}
    (paid,) = [span for span in receiver.named("recap paid") if span["trace_id"] == second_trace]
    assert {span["parent"] for span in dispatches} == {paid["span_id"]}
    assert any(span["attributes"]["eventdrop.outcome"] == "done" for span in dispatches)
    second_ready = [
        span for span in receiver.named("recap ready") if span["trace_id"] == second_trace
    ]
    assert len(second_ready) == 1
