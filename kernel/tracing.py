"""Traces (OpenTelemetry): one trace per webhook and per recap, carried on the rows.

Off unless the standard variables turn it on (`tracing_wanted`): OTEL_EXPORTER_OTLP_ENDPOINT
(or its _TRACES_ twin) or OTEL_TRACES_EXPORTER, and not OTEL_SDK_DISABLED. Then `configure`
builds the SDK from its own classes, each reading its OTEL_* variables (sampler, exporter,
batch processor, resource), and instruments Django, psycopg and requests. Off, every helper
here is one module-level check: no span, no context, "" for a traceparent.

The hops are asynchronous (the inbox seconds later, the dispatcher minutes later, a callback
from the render service), so a span's context is stored on its row as a W3C `traceparent`
(raw event, delivery, side effect) and the next hop starts its span under it (`span(parent=
row.traceparent)`): hours later, in another process or after a restart, it joins the trace.
An unsampled trace stores its traceparent too (not sampled in its flags), so parent-based
sampling keeps it unsampled all the way. The runbook: docs/tracing.md.
"""

import atexit
import contextvars
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import (
    INVALID_SPAN,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    TraceFlags,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

TRACER_NAME = "eventdrop"
# The rows keep W3C trace context whatever OTEL_PROPAGATORS says for HTTP.
_W3C = TraceContextTextMapPropagator()
_enabled = False
# The header fields the configured propagators read (OTEL_PROPAGATORS): a request carrying
# none of them starts a trace without a parse.
_CONTEXT_FIELDS: frozenset[str] = frozenset(propagate.get_global_textmap().fields)


def enabled() -> bool:
    return _enabled


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """Whether the standard variables ask for traces (docs/tracing.md)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return bool(
        exporters
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


class NoOrphanClients(Sampler):
    """The configured sampler, except that a client span with no parent is dropped.

    A worker's polling queries (and a callback sent with no context) would otherwise each
    start a trace of one span; under a webhook's or a recap's span they follow it.
    """

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if kind == SpanKind.CLIENT:
            parent = trace.get_current_span(parent_context).get_span_context()
            if not parent.is_valid:
                return SamplingResult(Decision.DROP)
        return self.sampler.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"NoOrphanClients{{{self.sampler.get_description()}}}"


class HandedTraceIds(IdGenerator):
    """The SDK's random ids, except a trace id `enter` hands over: the one it has already
    asked the sampler about, so that a sampled receive span is built under that id."""

    def __init__(self) -> None:
        self.random = RandomIdGenerator()
        self.handed = threading.local()

    def hand(self, trace_id: int) -> None:
        self.handed.trace_id = trace_id

    def generate_trace_id(self) -> int:
        trace_id = getattr(self.handed, "trace_id", 0)
        if trace_id:
            self.handed.trace_id = 0
            return trace_id
        return self.random.generate_trace_id()

    def generate_span_id(self) -> int:
        return self.random.generate_span_id()

    def is_trace_id_random(self) -> bool:
        return True


# The provider's sampler and ids when the ids are ours: `enter` then asks the sampler first.
_sampler: Sampler | None = None
_ids: HandedTraceIds | None = None
# What the SDK's unsampled spans carry: not sampled, a random trace id (W3C level 2).
_UNSAMPLED = TraceFlags(TraceFlags.RANDOM_TRACE_ID)


def process_name(environ: Mapping[str, str] = os.environ, argv: Sequence[str] = sys.argv) -> str:
    """What this process is, for its spans: EVENTDROP_PROCESS, else manage.py's command."""
    kind = environ.get("EVENTDROP_PROCESS", "")
    if kind:
        return kind
    if len(argv) > 1 and argv[0].endswith("manage.py"):
        return argv[1]
    return "web"


def configure(*, process: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Install the SDK and the instrumentations once per process, if the environment asks
    for traces; whether tracing is on."""
    global _enabled
    if _enabled or not tracing_wanted(environ):
        return _enabled
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    # TracerProvider() reads OTEL_TRACES_SAMPLER(_ARG) (default parentbased_always_on);
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    sampler = NoOrphanClients(TracerProvider().sampler)
    attributes: dict[str, str | int] = {"eventdrop.process": process, "process.pid": os.getpid()}
    if not environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = "eventdrop"
    resource = Resource.create(attributes)
    provider = TracerProvider(sampler=sampler, resource=resource, id_generator=HandedTraceIds())
    for name in (environ.get("OTEL_TRACES_EXPORTER", "") or "otlp").split(","):
        name = name.strip().lower()
        if name == "otlp":
            # OTLP over HTTP/protobuf; OTEL_EXPORTER_OTLP_* give its endpoint, headers,
            # timeout. Exports run on the processor's thread, never on a request.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            from django.core.exceptions import ImproperlyConfigured

            raise ImproperlyConfigured(
                f"OTEL_TRACES_EXPORTER={name!r}: only otlp (HTTP/protobuf) and console are "
                "installed (docs/tracing.md)."
            )
    trace.set_tracer_provider(provider)
    _instrument(environ)
    global _CONTEXT_FIELDS
    _CONTEXT_FIELDS = frozenset(propagate.get_global_textmap().fields)
    _use(provider)
    return True


def _use(provider: Any) -> None:
    global _enabled, _tracer, _sampler, _ids
    # Once: the SDK builds a new tracer on every get_tracer call.
    _tracer = provider.get_tracer(TRACER_NAME)
    ours = isinstance(provider.id_generator, HandedTraceIds)
    _sampler, _ids = (provider.sampler, provider.id_generator) if ours else (None, None)
    _enabled = True


def _instrument(environ: Mapping[str, str]) -> None:
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    # The standard variable that leaves an instrumentation out (as opentelemetry-instrument
    # reads it): comma-separated names.
    disabled = {
        name.strip()
        for name in environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")
    }
    # Django: a server span per console/API request (the webhooks' ASGI path has its own,
    # ingress/asgi.py). psycopg: a client span per query, under whatever span is current.
    # requests: a client span per call, its traceparent injected.
    if "django" not in disabled:
        DjangoInstrumentor().instrument()
    if "psycopg" not in disabled:
        PsycopgInstrumentor().instrument(enable_commenter=False)
    if "requests" not in disabled:
        RequestsInstrumentor().instrument()


def activate_for_tests(provider: Any) -> None:
    """Tests: spans go to `provider` (an SDK TracerProvider with its own processors)."""
    _use(provider)


def deactivate_for_tests() -> None:
    global _enabled, _tracer, _sampler, _ids
    _forget_untraced()
    _tracer, _sampler, _ids = None, None, None
    _enabled = False


_tracer: trace.Tracer | None = None


def _get_tracer() -> trace.Tracer:
    return _tracer or trace.get_tracer(TRACER_NAME)


# --- context on rows ---------------------------------------------------------------------------


def traceparent_of(span: Span) -> str:
    """The W3C traceparent of `span` ("" for none): version 00, as TraceContextTextMapPropagator
    writes it, without the Context and carrier it builds (once per webhook)."""
    context = span.get_span_context()
    if not context.is_valid:
        return ""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def current_traceparent() -> str:
    """The traceparent of the current span, to store on a row ("" when tracing is off)."""
    if not _enabled:
        return ""
    return traceparent_of(trace.get_current_span())


def context_of(traceparent: str) -> Context | None:
    """The context a stored traceparent names (None for "" or a malformed one)."""
    if not traceparent:
        return None
    context = _W3C.extract({"traceparent": traceparent})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def trace_id_of(traceparent: str) -> str:
    """The 32 hex digits of a traceparent's trace id ("" when it has none)."""
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else ""


# --- spans -------------------------------------------------------------------------------------


@contextmanager
def span(
    name: str,
    *,
    parent: str | None = None,
    headers: Mapping[str, str] | None = None,
    links: Sequence[str] = (),
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attributes = None,
) -> Iterator[Span]:
    """A span, current inside the block, under `parent` (a stored traceparent), else the
    context `headers` carry (an HTTP request's), else the current span. `links`: stored
    traceparents of related spans. Off: INVALID_SPAN, nothing recorded."""
    if not _enabled:
        yield INVALID_SPAN
        return
    context = None
    if parent:
        context = context_of(parent)
    elif headers is not None:
        context = propagate.extract(headers)
    with _get_tracer().start_as_current_span(
        name,
        context=context,
        kind=kind,
        attributes=attributes,
        links=_links(links),
    ) as current:
        yield current


def enter(
    name: str, *, headers: Mapping[str, str], kind: SpanKind, attributes: Attributes = None
) -> tuple[Span, object]:
    """A span until `leave(span, token)`, under the context `headers` carry: `span()`
    without its three generator context managers, for the receive path (one per webhook:
    docs/benchmarks.md). Made current only when sampled: the caller passes the span on, and
    an unsampled one would only make its logs' trace ids point to no trace. Only when
    enabled()."""
    context = None
    if not _CONTEXT_FIELDS.isdisjoint(headers):
        context = propagate.extract(headers)
    elif _ids is not None and _sampler is not None and not _current_is_valid():
        # A root, the sampler asked first: most are dropped, and a dropped one needs no
        # more than its ids (the SDK building it was 5.7 % of a server's py-spy samples).
        trace_id = _ids.random.generate_trace_id()
        if not _sampler.should_sample(None, trace_id, name, kind).decision.is_recording():
            ids = SpanContext(trace_id, _ids.generate_span_id(), False, _UNSAMPLED)
            return NonRecordingSpan(ids), None
        _ids.hand(trace_id)
    current = _get_tracer().start_span(name, context=context, kind=kind, attributes=attributes)
    if _ids is not None:
        _ids.hand(0)  # not taken if the tracer made no root span
    if not current.is_recording():
        return current, None
    return current, otel_context.attach(set_span_in_context(current))


def _current_is_valid() -> bool:
    return trace.get_current_span().get_span_context().is_valid


def leave(span: Span, token: object) -> None:
    if token is not None:
        otel_context.detach(token)  # type: ignore[arg-type]
    span.end()


def start_span(
    name: str,
    *,
    parent: str = "",
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attributes = None,
) -> Span:
    """A span the caller ends (`span.end()`), not made current: one of a batch's spans, each
    under its own row's traceparent. Off: INVALID_SPAN."""
    if not _enabled:
        return INVALID_SPAN
    return _get_tracer().start_span(
        name, context=context_of(parent), kind=kind, attributes=attributes
    )


def _links(traceparents: Sequence[str]) -> list[Link]:
    links = []
    for traceparent in traceparents:
        context = context_of(traceparent)
        if context is not None:
            links.append(Link(trace.get_current_span(context).get_span_context()))
    return links


def untraced_context() -> contextvars.Context:
    """A context of its own (no current span) in which no instrumentation makes a span: for
    a task doing work for many requests at once (the store's group commit), whose queries
    belong to none of their traces."""
    global _untraced
    if not _enabled:
        return contextvars.Context()
    if _untraced is None:
        from opentelemetry.instrumentation.utils import suppress_instrumentation

        # Entered once inside the new context, copied per task, and left in that context at
        # exit: a suppression left from any other context fails to detach (an ERROR log).
        context, stack = contextvars.Context(), ExitStack()
        context.run(stack.enter_context, suppress_instrumentation())
        atexit.register(context.run, stack.close)
        _untraced = (context, stack)
    return _untraced[0].copy()


def _forget_untraced() -> None:
    global _untraced
    if _untraced is not None:
        context, stack = _untraced
        atexit.unregister(context.run)
        context.run(stack.close)
        _untraced = None


_untraced: tuple[contextvars.Context, ExitStack] | None = None


def inject(headers: dict[str, str]) -> None:
    """Add the current span's context to an outgoing request's headers (W3C traceparent)."""
    if _enabled:
        propagate.inject(headers)


def log_fields() -> dict[str, str]:
    """trace_id and span_id of the current span, for a log line ({} when there is none)."""
    if not _enabled:
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def trace_url(traceparent: str, template: str) -> str:
    """The tracing backend's page of a row's trace (TRACE_URL_TEMPLATE with {trace_id});
    "" without a template or a trace."""
    trace_id = trace_id_of(traceparent)
    if not template or not trace_id:
        return ""
    return template.replace("{trace_id}", trace_id)
