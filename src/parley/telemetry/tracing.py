"""Traces: OpenTelemetry spans of every turn, one trace per turn (docs/operations.md#traces).

Tracing is on when the standard variables name an OTLP endpoint
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``; not with
``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``), or when the application
parley runs in has installed a tracer provider of its own.  Off, every function here
returns at its first line and the SDK is never imported: :func:`tracer` is the switch,
decided once per process.

The SDK and its exporter read every other ``OTEL_*`` variable themselves (headers,
compression, sampler, resource attributes, batch sizes).  parley only names the service
when ``OTEL_SERVICE_NAME`` does not (``parley-worker``, ``parley-gateway``…).

A turn's trace: the submission's span is the parent of everything the turn does.  Its
W3C ``traceparent`` is stored with the run (:func:`carrier`), and whichever process
drives an attempt restores it (:func:`context_of`), so an attempt after a crash, after a
wait for capacity or for an approval answered a day later is in the same trace.  A run
submitted without a context (tracing off at the time, a batch line) takes the context of
its first traced attempt.

Content (prompts, completions, tool arguments and results) is recorded only with
``PARLEY_TRACE_CONTENT=1`` (:func:`content`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any

from parley.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanKind, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("parley.tracing")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
CONTENT_LIMIT = 8_192
"""Characters of one piece of content kept on a span: a backend refuses (or truncates)
huge attributes, and a prompt's whole history is in the store anyway."""

_lock = threading.Lock()
_decided = False
_tracer: Tracer | None = None
_owned: Any = None  # the SDK provider this module installed (flushed at shutdown)
_service = "parley"
_content = False
_settings = Settings()
"""The process's settings (:func:`configure`); until then, nothing set: no traces."""


def name_service(service: str) -> None:
    """The ``service.name`` this process reports unless ``OTEL_SERVICE_NAME`` says
    otherwise (call before its first span: ``parley worker`` → ``parley-worker``)."""
    global _service
    _service = service


def configure(settings: Settings) -> None:
    """What this process's variables say (its :class:`Settings`, read as it starts): call
    before the first span.  Whether traces are exported (the ``OTEL_*`` variables) is
    decided once, at the first span; whether spans carry content
    (``PARLEY_TRACE_CONTENT``) follows the last call."""
    global _settings, _content
    with _lock:
        _settings = settings
        _content = settings.trace_content


def configured(otel: Mapping[str, str] | None = None) -> bool:
    """Whether the standard variables (``otel``, default: this process's) ask for traces
    to be exported over OTLP."""
    otel = _settings.telemetry if otel is None else otel
    if otel.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = otel.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if "otlp" not in {e.strip() for e in exporters.split(",")}:
        return False  # none, or only exporters parley does not ship (a warning says so)
    return any(otel.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def _warn_about_what_is_not_shipped(otel: Mapping[str, str]) -> None:
    """parley exports OTLP over HTTP (protobuf): say so once when the variables ask for
    another protocol or exporter, rather than leave an operator wondering."""
    protocol = (
        otel.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or otel.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol != "http/protobuf":
        log.warning("parley exports traces over OTLP/HTTP (http/protobuf), not %s", protocol)
    exporters = otel.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters and exporters != "none" and "otlp" not in exporters.split(","):
        log.warning("parley exports traces over OTLP only, not %s: no spans", exporters)


def tracer() -> Tracer | None:
    """parley's tracer, or None when tracing is off (then nothing is recorded)."""
    if _decided:
        return _tracer
    with _lock:
        if not _decided:
            _decide()
    return _tracer


def _decide() -> None:
    global _decided, _tracer, _owned
    _warn_about_what_is_not_shipped(_settings.telemetry)
    if not configured() and "opentelemetry.trace" not in sys.modules:
        # Nobody asked for traces, and no provider can have been installed without this
        # module: off, without importing even the API.
        _tracer, _decided = None, True
        return
    try:
        from opentelemetry import trace

        current = trace.get_tracer_provider()
        installed = not isinstance(current, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
        if configured() and not installed:
            _owned = _install(trace)
            current = _owned
        if configured() or installed:
            _tracer = current.get_tracer("parley")
    except Exception:  # a broken exporter setting must not stop a worker: no traces
        log.warning("tracing is configured but could not start; no spans", exc_info=True)
        _tracer = None
    _decided = True


def _install(trace: Any) -> Any:
    """An SDK tracer provider exporting over OTLP/HTTP in batches, made the process's."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, but what it
    # is given wins: give the default name only when neither names the service.
    otel = _settings.telemetry
    named = otel.get("OTEL_SERVICE_NAME") or "service.name=" in otel.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {SERVICE_NAME: _service})
    provider = TracerProvider(resource=resource)
    # The batch processor's thread survives a fork (the SDK restarts it in the child),
    # so a prefork pool's children export on their own.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def flush(timeout_seconds: float = 5.0) -> None:
    """Export what is buffered (a worker's warm shutdown, a client's close)."""
    if _owned is not None:
        _owned.force_flush(int(timeout_seconds * 1000))


def shutdown() -> None:
    """Export what is buffered and stop the exporter (the process is ending)."""
    if _owned is not None:
        _owned.shutdown()


def reset_for_tests() -> None:
    """Forget the settings, and decide again at the next span (tests change the
    variables within one process, and configure anew as a client is made)."""
    global _decided, _tracer, _owned, _settings, _content
    with _lock:
        _settings, _content = Settings(), False
        if _owned is not None:
            _owned.shutdown()
            from opentelemetry import trace
            from opentelemetry.util._once import Once

            # The API lets a process set its provider once; a test sets it anew.
            trace._TRACER_PROVIDER_SET_ONCE = Once()
            trace._TRACER_PROVIDER = None
        _decided, _tracer, _owned = False, None, None


def content() -> bool:
    """Whether spans may carry content (``PARLEY_TRACE_CONTENT=1``)."""
    return _content and tracer() is not None


def clipped(text: str) -> str:
    """Content cut to what one attribute keeps."""
    return text if len(text) <= CONTENT_LIMIT else text[:CONTENT_LIMIT] + "…"


# ---------------------------------------------------------------------- spans

_OFF: AbstractContextManager[None] = nullcontext()


def span(
    name: str,
    *,
    kind: str = "INTERNAL",
    attributes: Mapping[str, Any] | None = None,
    parent: Context | None = None,
    links: Sequence[Link] = (),
) -> AbstractContextManager[Span | None]:
    """A span made current for the block (None inside when tracing is off).  ``parent``
    (a restored context) replaces the current one; an exception leaving the block marks
    the span an error."""
    found = tracer()
    if found is None:
        return _OFF
    return found.start_as_current_span(
        name,
        context=parent,
        kind=_kind(kind),
        attributes=dict(attributes or {}),
        links=list(links),
    )


def record(
    name: str,
    *,
    started: float | datetime,
    ended: float | datetime | None = None,
    attributes: Mapping[str, Any] | None = None,
    parent: Context | None = None,
) -> None:
    """A span of something that already happened (a wait, measured at its end): from
    ``started`` to ``ended`` (now if None), as ``time.time()`` seconds or datetimes."""
    found = tracer()
    if found is None:
        return
    begin = _ns(started)
    finish = _ns(ended) if ended is not None else time.time_ns()
    made = found.start_span(
        name, context=parent, attributes=dict(attributes or {}), start_time=begin
    )
    made.end(end_time=max(begin, finish))


def _ns(moment: float | datetime) -> int:
    seconds = moment.timestamp() if isinstance(moment, datetime) else moment
    return int(seconds * 1e9)


def _kind(kind: str) -> SpanKind:
    from opentelemetry.trace import SpanKind

    return SpanKind[kind]


def current() -> Span | None:
    """The span current in this thread, if tracing is on and one is recording."""
    if tracer() is None:
        return None
    from opentelemetry import trace

    found = trace.get_current_span()
    return found if found.is_recording() else None


def set_attributes(attributes: Mapping[str, Any]) -> None:
    """Add to the current span (nothing when there is none)."""
    found = current()
    if found is not None:
        found.set_attributes(dict(attributes))


def fail(span_: Span | None, error_type: str, message: str = "") -> None:
    """Mark ``span_`` failed, with ``error.type`` as the conventions name it."""
    if span_ is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span_.set_attribute("error.type", error_type)
    span_.set_status(Status(StatusCode.ERROR, message or None))


# ---------------------------------------------------------------------- contexts


def carrier() -> dict[str, str] | None:
    """The current context as W3C headers (``traceparent``, and ``tracestate`` when
    there is one), to store with a run; None when tracing is off or nothing is current."""
    if tracer() is None:
        return None
    from opentelemetry import trace

    if not trace.get_current_span().get_span_context().is_valid:
        return None
    headers: dict[str, str] = {}
    _w3c().inject(headers)
    return headers or None


def context_of(stored: Mapping[str, str] | None) -> Context | None:
    """The context a stored carrier names (None: none, or tracing is off)."""
    if not stored or tracer() is None:
        return None
    return _w3c().extract(dict(stored))


def _w3c() -> TraceContextTextMapPropagator:
    """The W3C trace context propagator, whatever ``OTEL_PROPAGATORS`` says: a run keeps
    its trace's ``traceparent`` and ``tracestate``, never a caller's baggage (which an
    instrumented client in the host could send on to a provider)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def link_to_current() -> list[Link]:
    """A link to the span current here (the request or task that caused this), for a
    span parented elsewhere: an approval's answer in the turn's trace links the request
    that gave it."""
    if tracer() is None:
        return []
    from opentelemetry import trace
    from opentelemetry.trace import Link

    here = trace.get_current_span().get_span_context()
    return [Link(here)] if here.is_valid else []


def trace_id() -> str | None:
    """The current trace's id in hex (a metric's exemplar), if a sampled span is current."""
    if tracer() is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return format(context.trace_id, "032x")


def new_root() -> Context:
    """An empty context: a span started in it begins a trace of its own (not the
    current one's, which may be the task that kicked the turn)."""
    from opentelemetry.context import Context

    return Context()


@contextmanager
def attached(context: Context | None) -> Iterator[None]:
    """Make ``context`` current for the block (nothing when None)."""
    if context is None:
        yield
        return
    from opentelemetry import context as otel_context

    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)
