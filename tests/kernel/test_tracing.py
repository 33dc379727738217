"""kernel/tracing.py in one process: the switch, the helpers, and the trace carried on the
rows through receive → verify → deliver → paid → dispatch (render POST with traceparent),
retries as follow-up spans of the same trace. The same across real processes:
tests/kernel/test_tracing_processes.py."""

import dataclasses
import gc
import io
import json
import logging
import uuid

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind

from ingress import handlers
from ingress.inbox import inbox_run_once
from ingress.models import Delivery, RawEvent
from kernel import tracing
from kernel.logformat import JsonFormatter
from outbox.dispatcher import dispatch_run
from outbox.models import RecapSideEffect
from recaps.models import RecapStatus
from tests.ingress.test_receive_contract import SIGNED, via_asgi
from tests.recaps.factories import EventFactory, RecapFactory
from tests.recaps.fixtures import fake_renderer  # noqa: F401 (a fixture)
from tests.support.signing import checkout_session_event, store_signed_stripe_event

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def provider_with(exporter, sampler=None):
    provider = TracerProvider(
        sampler=tracing.NoOrphanClients(sampler or ParentBased(ALWAYS_ON)),
        id_generator=tracing.HandedTraceIds(),  # as configure() builds it
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter)
    tracing.activate_for_tests(provider)
    try:
        yield exporter
    finally:
        tracing.deactivate_for_tests()
        provider.shutdown()


def by_name(exporter):
    found: dict[str, list] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


def traceparent(span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


# --- the switch ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "eventdrop"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ],
)
def test_tracing_is_off_unless_an_otel_variable_turns_it_on(environ, wanted):
    assert tracing.tracing_wanted(environ) is wanted


def test_off_every_helper_is_inert():
    assert not tracing.enabled()
    with tracing.span("x", parent=TRACEPARENT) as span:
        assert not span.is_recording()
        assert tracing.current_traceparent() == ""
    assert tracing.start_span("y").is_recording() is False
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {} and tracing.log_fields() == {}


def test_process_name_is_the_kind_else_the_command():
    assert tracing.process_name({"EVENTDROP_PROCESS": "inbox"}, ["x"]) == "inbox"
    assert tracing.process_name({}, ["manage.py", "run_fake_renderer"]) == "run_fake_renderer"
    assert tracing.process_name({}, ["-m"]) == "web"


# --- the helpers -----------------------------------------------------------------------------


def test_a_stored_traceparent_round_trips_and_junk_names_no_context():
    assert tracing.trace_id_of(TRACEPARENT) == "0af7651916cd43dd8448eb211c80319c"
    context = tracing.context_of(TRACEPARENT)
    assert context is not None
    for junk in ("", "00-xyz", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"):
        assert tracing.context_of(junk) is None
    assert tracing.trace_id_of("junk") == ""


def test_trace_url_fills_the_template():
    template = "https://tempo.example/explore?trace={trace_id}"
    assert tracing.trace_url(TRACEPARENT, template) == (
        "https://tempo.example/explore?trace=0af7651916cd43dd8448eb211c80319c"
    )
    assert tracing.trace_url(TRACEPARENT, "") == ""
    assert tracing.trace_url("", template) == ""


def test_a_span_under_a_stored_traceparent_joins_its_trace_and_links(spans):
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    with tracing.span("hop", parent=TRACEPARENT, links=[other, "junk"]) as span:
        assert tracing.current_traceparent() == traceparent(span)
    (hop,) = spans.get_finished_spans()
    assert f"{hop.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{hop.parent.span_id:016x}" == "b7ad6b7169203331"
    assert [f"{link.context.trace_id:032x}" for link in hop.links] == ["1" * 32]


def test_an_unsampled_trace_stays_unsampled_on_the_next_hop(spans):
    unsampled = TRACEPARENT[:-2] + "00"
    with tracing.span("hop", parent=unsampled) as span:
        assert not span.is_recording()
        # Stored again unsampled: the hop after it is not sampled either.
        assert tracing.current_traceparent().endswith("-00")
    assert spans.get_finished_spans() == ()


def test_headers_carry_the_context_in_and_out(spans):
    with tracing.span("receive", headers={"traceparent": TRACEPARENT}, kind=SpanKind.SERVER):
        headers: dict[str, str] = {}
        tracing.inject(headers)
    (receive,) = spans.get_finished_spans()
    assert headers["traceparent"] == traceparent(receive)
    assert tracing.trace_id_of(headers["traceparent"]) == tracing.trace_id_of(TRACEPARENT)


def test_enter_and_leave_make_a_receive_span_current_under_the_senders_context(spans):
    span, token = tracing.enter(
        "webhook receive",
        headers={"traceparent": TRACEPARENT},
        kind=SpanKind.SERVER,
        attributes={"eventdrop.source": "renderer"},
    )
    stored = tracing.current_traceparent()
    tracing.leave(span, token)
    assert tracing.current_traceparent() == ""  # detached
    (receive,) = spans.get_finished_spans()
    assert stored == traceparent(receive)
    assert f"{receive.parent.span_id:016x}" == "b7ad6b7169203331"
    # Without the propagators' fields the request starts a trace of its own.
    span, token = tracing.enter(
        "webhook receive", headers={"host": "x"}, kind=SpanKind.SERVER, attributes=None
    )
    tracing.leave(span, token)
    assert spans.get_finished_spans()[-1].parent is None


def sampled_flag(traceparent: str) -> int:
    """The W3C `sampled` flag (the SDK also sets the random-trace-id one, 0x02)."""
    return int(traceparent.rsplit("-", 1)[1], 16) & 1


def test_an_unsampled_receive_span_is_not_made_current_and_still_names_its_trace():
    """Making it current was about a third of its cost (docs/benchmarks.md, "Tracing"): the
    receive path passes the span on; its traceparent (not sampled) keeps the next hops so."""
    provider = provider_with(InMemorySpanExporter(), ParentBased(TraceIdRatioBased(0.0)))
    tracing.activate_for_tests(provider)
    try:
        span, token = tracing.enter(
            "webhook receive", headers={"host": "x"}, kind=SpanKind.SERVER, attributes=None
        )
        assert token is None and not span.is_recording()
        assert tracing.current_traceparent() == ""
        assert not sampled_flag(tracing.traceparent_of(span))
        tracing.leave(span, token)
    finally:
        tracing.deactivate_for_tests()
        provider.shutdown()


def test_a_receive_span_is_sampled_as_the_sampler_decided_for_its_own_trace_id():
    """enter() asks the sampler before the SDK builds a span (a dropped root needs only its
    ids), and hands the SDK the trace id it asked about: a sampled span is under that id."""
    exporter = InMemorySpanExporter()
    ratio = TraceIdRatioBased(0.5)
    provider = provider_with(exporter, ParentBased(ratio))
    tracing.activate_for_tests(provider)
    try:
        entered = []
        for _ in range(200):
            span, token = tracing.enter(
                "webhook receive", headers={"host": "x"}, kind=SpanKind.SERVER
            )
            entered.append((span, span.is_recording()))
            tracing.leave(span, token)
        # Under a sender's context the SDK decides as ever, and takes no handed id.
        span, token = tracing.enter(
            "webhook receive", headers={"traceparent": TRACEPARENT}, kind=SpanKind.SERVER
        )
        tracing.leave(span, token)
    finally:
        tracing.deactivate_for_tests()
        provider.shutdown()
    sampled = set()
    for span, recording in entered:
        trace_id = span.get_span_context().trace_id
        decision = ratio.should_sample(None, trace_id, "webhook receive").decision
        assert recording == decision.is_sampled()
        assert sampled_flag(tracing.traceparent_of(span)) == decision.is_sampled()
        if decision.is_sampled():
            sampled.add(trace_id)
    assert 0 < len(sampled) < 200
    exported = {span.context.trace_id for span in exporter.get_finished_spans()}
    assert exported == sampled | {int(TRACEPARENT.split("-")[1], 16)}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_the_asgi_receive_stores_its_spans_traceparent_sampled_or_not(rate):
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter, ParentBased(TraceIdRatioBased(rate)))
    tracing.activate_for_tests(provider)
    try:
        status, _, _ = via_asgi("/webhooks/stripe/", SIGNED, b"{}")
    finally:
        tracing.deactivate_for_tests()
        provider.shutdown()
    assert status == 202
    stored = RawEvent.objects.get().traceparent
    if rate:
        (receive,) = exporter.get_finished_spans()
        assert stored == traceparent(receive)
        assert (receive.attributes or {})["eventdrop.raw_event_id"] == RawEvent.objects.get().id
    else:
        assert exporter.get_finished_spans() == ()
        assert not sampled_flag(stored) and tracing.trace_id_of(stored)


def test_client_spans_without_a_parent_are_dropped_and_follow_one_otherwise():
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter, ParentBased(TraceIdRatioBased(1.0)))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("poll", kind=SpanKind.CLIENT) as orphan:
        assert not orphan.is_recording()
    with (
        tracer.start_as_current_span("work"),
        tracer.start_as_current_span("query", kind=SpanKind.CLIENT) as query,
    ):
        assert query.is_recording()
    assert sorted(span.name for span in exporter.get_finished_spans()) == ["query", "work"]
    assert "NoOrphanClients" in provider.sampler.get_description()


def test_the_group_commits_context_has_no_span_and_suppresses_the_instrumentations(spans):
    from opentelemetry.instrumentation.utils import is_instrumentation_enabled

    with tracing.span("webhook receive"):
        context = tracing.untraced_context()
        assert context.run(tracing.current_traceparent) == ""
        assert not context.run(is_instrumentation_enabled)
        assert is_instrumentation_enabled()  # the caller's own context keeps them
    assert not tracing.untraced_context().run(is_instrumentation_enabled)
    tracing.deactivate_for_tests()
    assert tracing.untraced_context().run(is_instrumentation_enabled)  # off: a plain context


def test_the_group_commits_context_is_made_and_left_without_an_error(spans, caplog):
    # Its suppression was once left by the garbage collector, from another context: an
    # ERROR "Failed to detach context" from every web process.
    with caplog.at_level(logging.ERROR, logger="opentelemetry.context"):
        tracing.untraced_context()
        gc.collect()
        tracing.deactivate_for_tests()  # leaves it, as the process's exit does
    assert [record.getMessage() for record in caplog.records] == []


def test_json_logs_carry_the_span(spans):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger(f"test.tracing.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    with tracing.span("hop", parent=TRACEPARENT) as span:
        logger.info("inside")
    logger.info("outside")
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert inside["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert inside["span_id"] == f"{span.get_span_context().span_id:016x}"
    assert "trace_id" not in outside


# --- on the rows, through the hops -------------------------------------------------------------


@pytest.mark.django_db
def test_off_the_rows_keep_no_trace():
    recap = RecapFactory.create(event=EventFactory.create())
    store_signed_stripe_event(checkout_session_event(str(recap.id)))
    inbox_run_once()
    assert set(RawEvent.objects.values_list("traceparent", flat=True)) == {""}
    assert set(RecapSideEffect.objects.values_list("traceparent", flat=True)) == {""}


@pytest.mark.django_db
def test_a_paid_recap_continues_the_payments_trace_up_to_the_render_post(
    spans, fake_renderer, settings  # noqa: F811 (the fixture imported above)
):
    recap = RecapFactory.create(event=EventFactory.create())
    with tracing.span("webhook receive", kind=SpanKind.SERVER):
        event = store_signed_stripe_event(checkout_session_event(str(recap.id)))
    inbox_run_once()
    recap.refresh_from_db()
    assert recap.status == RecapStatus.PAID
    report = dispatch_run()
    assert report.count("done") == 1, report.summary()

    found = by_name(spans)
    (receive,) = found["webhook receive"]
    (verify,) = found["webhook verify"]
    (deliver,) = found["webhook deliver"]
    (paid,) = found["recap paid"]
    (dispatch,) = found["render dispatch"]
    event.refresh_from_db()
    assert event.traceparent == traceparent(receive)
    assert verify.parent.span_id == receive.context.span_id
    assert deliver.parent.span_id == verify.context.span_id
    assert deliver.attributes["eventdrop.handler"] == "recaps.handlers.record_checkout_session"
    assert paid.parent.span_id == deliver.context.span_id
    row = RecapSideEffect.objects.get(recap=recap)
    assert row.traceparent == traceparent(paid)
    assert dispatch.parent.span_id == paid.context.span_id
    assert dispatch.attributes["eventdrop.outcome"] == "done"
    assert {span.context.trace_id for span in spans.get_finished_spans()} == {
        receive.context.trace_id
    }
    # The render POST carried the dispatch's context; the fake keeps it for its callback.
    (render,) = fake_renderer.renders.values()
    assert render.traceparent == traceparent(dispatch)


@pytest.mark.django_db
def test_a_retried_delivery_is_a_follow_up_span_of_the_same_trace(spans, settings, monkeypatch):
    recap = RecapFactory.create(event=EventFactory.create())
    with tracing.span("webhook receive", kind=SpanKind.SERVER):
        store_signed_stripe_event(checkout_session_event(str(recap.id)))
    spec = handlers.get_handler("recaps.handlers.record_checkout_session")
    assert spec is not None
    calls = []

    def fails_once(event, payload):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug of ours, once")
        return original(event, payload)

    original = spec.func
    monkeypatch.setitem(handlers._registry, spec.name, dataclasses.replace(spec, func=fails_once))
    inbox_run_once()  # the first attempt raises: the delivery waits for its retry
    delivery = Delivery.objects.get()
    assert delivery.status == "pending" and delivery.traceparent
    Delivery.objects.update(next_attempt_at=delivery.created_at)
    inbox_run_once()
    delivery.refresh_from_db()
    assert delivery.status == "done"

    found = by_name(spans)
    (verify,) = found["webhook verify"]
    attempts = found["webhook deliver"]
    assert len(attempts) >= 2
    assert delivery.traceparent == traceparent(verify)
    assert {span.context.trace_id for span in attempts} == {verify.context.trace_id}
    assert {span.parent.span_id for span in attempts} == {verify.context.span_id}
    assert not attempts[0].status.is_ok and attempts[-1].status.is_ok


def test_the_console_links_a_rows_trace_through_the_template(settings):
    from console.presentation import EMPTY, trace_link

    settings.TRACE_URL_TEMPLATE = "https://jaeger.example/trace/{trace_id}"
    assert trace_link(TRACEPARENT) == (
        '<a href="https://jaeger.example/trace/0af7651916cd43dd8448eb211c80319c" '
        'rel="noopener noreferrer">0af7651916cd43dd8448eb211c80319c</a>'
    )
    assert trace_link("") == EMPTY
    settings.TRACE_URL_TEMPLATE = ""
    assert trace_link(TRACEPARENT) == "0af7651916cd43dd8448eb211c80319c"
