"""A real OTLP/HTTP trace receiver on loopback, for tests that check what parley exports.

It is what an OpenTelemetry collector is to the standard exporter: it takes
``POST /v1/traces`` (binary protobuf, or OTLP/JSON; gzip or deflate compressed, as
``OTEL_EXPORTER_OTLP_COMPRESSION`` may ask), decodes each ``ExportTraceServiceRequest``
with the generated OpenTelemetry protobuf classes, answers ``200`` with an
``ExportTraceServiceResponse``, and keeps every span as a plain :class:`ReceivedSpan` a
test can compare with ``==``.  Point the exporter at it with
``OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint`` (the exporter appends ``/v1/traces``),
or pass ``receiver.traces_endpoint`` to ``OTLPSpanExporter(endpoint=...)``::

    with OtlpReceiver() as receiver:
        ...  # run the code under test with the exporter pointed at receiver.endpoint
        spans = receiver.wait_for(lambda spans: any(s.name == "turn" for s in spans))
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, TypeAlias, cast
from urllib.parse import urlsplit

# protobuf ships no type stubs (no py.typed, and types-protobuf is not installed); every
# message below is therefore ``Any`` to mypy, and this module converts each field to a
# plain Python type the moment it reads it.
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"

AttributeValue: TypeAlias = (
    "str | bool | int | float | bytes | tuple[AttributeValue, ...] | "
    "dict[str, AttributeValue] | None"
)
"""An OTLP ``AnyValue`` as Python: arrays become tuples (so a span stays comparable and
its values hashable where they can be), key/value lists become dicts, an empty value
``None``."""

Attributes: TypeAlias = dict[str, AttributeValue]
"""A span's, event's, link's or resource's attributes by key."""


CONTENT_ATTRIBUTES = frozenset(
    {
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
        "parley.prompt",
    }
)
"""The attributes of parley's spans that carry content (``PARLEY_TRACE_CONTENT=1``)."""


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver decoded it: ids in lowercase hex, enums by name."""

    name: str
    trace_id: str
    """32 lowercase hex digits."""
    span_id: str
    """16 lowercase hex digits."""
    parent_span_id: str | None
    """16 lowercase hex digits, or ``None`` for a root span (the wire has it empty)."""
    kind: str
    """``"INTERNAL"``, ``"SERVER"``, ``"CLIENT"``, ``"PRODUCER"``, ``"CONSUMER"`` (or
    ``"UNSPECIFIED"``): the proto enum's name without its ``SPAN_KIND_`` prefix."""
    start_ns: int
    end_ns: int
    attributes: Attributes
    status_code: str
    """``"UNSET"``, ``"OK"`` or ``"ERROR"``."""
    status_message: str
    events: tuple[tuple[str, Attributes], ...]
    """Each event's ``(name, attributes)``, in the order the span recorded them."""
    links: tuple[tuple[str, str, Attributes], ...]
    """Each link's ``(trace_id, span_id, attributes)``, ids in hex."""
    resource: Attributes
    """The exporting process's resource attributes (``"service.name"`` and so on)."""
    scope: str
    """The instrumentation scope's name: what the tracer was created with."""


class OtlpReceiver:
    """The receiver: a ``ThreadingHTTPServer`` on ``127.0.0.1`` (a free port) served by a
    daemon thread.  Use it as a context manager, or call :meth:`start` and :meth:`close`.

    Every method is safe to call from the test while exports arrive."""

    def __init__(self) -> None:
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        # One condition guards the stored state and wakes wait_for on each export; its
        # lock is re-entrant, so a wait_for predicate may call spans() or trace().
        self._condition = threading.Condition()
        self._spans: list[ReceivedSpan] = []
        self._requests = 0
        self._rejected = 0
        self._encodings: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Bind a free port and serve; returns the receiver, so ``OtlpReceiver().start()``
        reads well."""
        if self._server is not None:
            raise RuntimeError("the OTLP receiver is already started")
        server = _Server(("127.0.0.1", 0), _Handler)
        server.receiver = self
        self._server = server
        # A short poll, so close() (shutdown waits for the loop's next poll) is quick.
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="otlp-receiver",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port; closing twice, or unstarted, does nothing."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        # server_close closes the listening socket (no ResourceWarning); the handler
        # threads are daemons that close their own connection after one request.
        server.server_close()
        if thread is not None:
            thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- where to send -----------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``: the value for ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        if self._server is None:
            raise RuntimeError("the OTLP receiver is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def traces_endpoint(self) -> str:
        """``http://127.0.0.1:PORT/v1/traces``: the value for
        ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTLPSpanExporter(endpoint=...)``."""
        return self.endpoint + TRACES_PATH

    # -- what arrived ------------------------------------------------------------------

    @property
    def requests(self) -> int:
        """How many export requests arrived and were decoded (each answered 200)."""
        with self._condition:
            return self._requests

    @property
    def rejected(self) -> int:
        """How many POSTs to ``/v1/traces`` were refused (undecodable body, unsupported
        content type or encoding); a healthy exporter leaves this at 0."""
        with self._condition:
            return self._rejected

    def encodings(self) -> list[str]:
        """Each decoded request's ``Content-Encoding`` (``"identity"`` when it had none),
        in arrival order: how a test sees the exporter really compressed."""
        with self._condition:
            return list(self._encodings)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in arrival order (a copy)."""
        with self._condition:
            return list(self._spans)

    def clear(self) -> None:
        """Forget the spans and counts received so far."""
        with self._condition:
            self._spans.clear()
            self._encodings.clear()
            self._requests = self._rejected = 0

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans of one trace (``trace_id`` in hex, either case), by start time."""
        wanted = trace_id.lower()
        return sorted(
            (span for span in self.spans() if span.trace_id == wanted),
            key=lambda span: span.start_ns,
        )

    def named(self, name_or_prefix: str) -> list[ReceivedSpan]:
        """The spans whose name is ``name_or_prefix`` or starts with it, in arrival order."""
        return [span for span in self.spans() if span.name.startswith(name_or_prefix)]

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 20.0
    ) -> list[ReceivedSpan]:
        """Until ``predicate(spans)`` holds for the spans received so far; returns them.

        Exporters send in the background (a batch processor on its own schedule), so a
        test waits for what it expects rather than sleeping.  On timeout this raises
        ``AssertionError`` showing every trace that did arrive."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while True:
                snapshot = list(self._spans)
                if predicate(snapshot):
                    return snapshot
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(self._summary(timeout, snapshot))
                self._condition.wait(remaining)

    def _summary(self, timeout: float, spans: list[ReceivedSpan]) -> str:
        head = (
            f"the OTLP receiver did not get the expected spans within {timeout:g}s; "
            f"it got {len(spans)} span(s) in {self._requests} request(s)"
            + (f", and refused {self._rejected}" if self._rejected else "")
        )
        return head + (":\n" + tree(spans) if spans else "")

    # -- called by the handler threads -------------------------------------------------

    def _record(self, spans: list[ReceivedSpan], encoding: str) -> None:
        with self._condition:
            self._spans.extend(spans)
            self._encodings.append(encoding)
            self._requests += 1
            self._condition.notify_all()

    def _record_rejection(self) -> None:
        with self._condition:
            self._rejected += 1
            self._condition.notify_all()


def tree(spans: Iterable[ReceivedSpan]) -> str:
    """The spans as an indented tree per trace, children under their parent by start time:
    for assertion messages.  A span whose parent did not arrive is shown as a root, marked
    with the missing parent's id."""
    spans = list(spans)
    lines: list[str] = []
    for trace_id in dict.fromkeys(span.trace_id for span in spans):
        members = sorted((s for s in spans if s.trace_id == trace_id), key=lambda s: s.start_ns)
        ids = {span.span_id for span in members}
        children: dict[str | None, list[ReceivedSpan]] = {}
        for span in members:
            parent = span.parent_span_id if span.parent_span_id in ids else None
            children.setdefault(parent, []).append(span)
        lines.append(f"trace {trace_id}")
        # Iterative, with a seen set, so a malformed export (a parent cycle) cannot hang
        # or recurse forever while a failing test reports it.
        seen: set[str] = set()
        stack = [(span, 1) for span in reversed(children.get(None, []))]
        while stack:
            span, depth = stack.pop()
            if span.span_id in seen:
                continue
            seen.add(span.span_id)
            lines.append("  " * depth + _describe(span, ids))
            stack.extend((child, depth + 1) for child in reversed(children.get(span.span_id, [])))
        lines.extend(
            "  " + _describe(s, ids) + " (in a cycle)" for s in members if s.span_id not in seen
        )
    return "\n".join(lines)


def _describe(span: ReceivedSpan, known_ids: set[str]) -> str:
    text = f"{span.name} [{span.kind}] span {span.span_id}"
    if span.status_code != "UNSET":
        text += f" {span.status_code}" + (f": {span.status_message}" if span.status_message else "")
    if span.parent_span_id is not None and span.parent_span_id not in known_ids:
        text += f" (parent {span.parent_span_id} not received)"
    return text


# -- HTTP --------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    """The HTTP server, knowing the receiver its handlers report to."""

    receiver: OtlpReceiver


class _Refused(Exception):
    """A request the receiver answers with an error status rather than a decode."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Handler(BaseHTTPRequestHandler):
    """Answers one request per connection (HTTP/1.0, the default): the exporter's
    connection pool copes, and close() never waits on an idle keep-alive connection."""

    def do_POST(self) -> None:
        # Read the whole body first, whatever the answer: replying to a request whose
        # body is unread can reset the connection before the client sees the status.
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if urlsplit(self.path).path != TRACES_PATH:
            self._reply(HTTPStatus.NOT_FOUND, b"only /v1/traces is served\n")
            return
        server = cast(_Server, self.server)
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        try:
            spans = _decode(content_type, _decompress(encoding, body))
        except _Refused as refused:
            server.receiver._record_rejection()
            self._reply(refused.status, refused.message.encode() + b"\n")
            return
        server.receiver._record(spans, encoding)
        # The OTLP/HTTP answer: an (empty, i.e. full success) ExportTraceServiceResponse,
        # in the same encoding as the request.
        response = ExportTraceServiceResponse()
        if content_type == JSON:
            self._reply(HTTPStatus.OK, json_format.MessageToJson(response).encode(), JSON)
        else:
            self._reply(HTTPStatus.OK, response.SerializeToString(), PROTOBUF)

    def _not_post(self) -> None:
        if urlsplit(self.path).path == TRACES_PATH:
            self._reply(HTTPStatus.METHOD_NOT_ALLOWED, b"POST only\n", allow="POST")
        else:
            self._reply(HTTPStatus.NOT_FOUND, b"only /v1/traces is served\n")

    do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_post

    def _reply(
        self,
        status: HTTPStatus,
        payload: bytes,
        content_type: str = "text/plain; charset=utf-8",
        allow: str | None = None,
    ) -> None:
        with contextlib.suppress(OSError):  # a client that gave up has gone
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            if allow is not None:
                self.send_header("Allow", allow)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a test reads what arrived, not a log on stderr."""


def _decompress(encoding: str, body: bytes) -> bytes:
    try:
        if encoding == "identity":
            return body
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            # HTTP's "deflate" is zlib-wrapped (what the Python exporter sends), but some
            # clients send raw deflate; a collector takes both, and so does this.
            try:
                return zlib.decompress(body)
            except zlib.error:
                return zlib.decompress(body, -zlib.MAX_WBITS)
    except (OSError, EOFError, zlib.error) as error:  # gzip raises BadGzipFile (OSError)
        raise _Refused(
            HTTPStatus.BAD_REQUEST, f"cannot {encoding}-decode the body: {error}"
        ) from error
    raise _Refused(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"unsupported Content-Encoding {encoding}")


def _decode(content_type: str, body: bytes) -> list[ReceivedSpan]:
    try:
        if content_type == PROTOBUF:
            request = ExportTraceServiceRequest.FromString(body)
        elif content_type == JSON:
            request = _parse_json(body)
        else:
            raise _Refused(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                f"unsupported Content-Type {content_type!r}: send {PROTOBUF} or {JSON}",
            )
        return _spans_of(request)
    except (DecodeError, json_format.ParseError, ValueError, TypeError) as error:
        # ValueError covers bad JSON, bad hex ids and invalid UTF-8 in the body.
        raise _Refused(
            HTTPStatus.BAD_REQUEST, f"cannot decode the export request: {error}"
        ) from error


def _parse_json(body: bytes) -> Any:
    """OTLP/JSON differs from protobuf's canonical JSON in one way that matters: trace and
    span ids are hex, not base64.  Rewrite them, then let protobuf parse the rest (enums
    as numbers, int64 as strings or numbers, unknown fields ignored: all as the spec
    says a receiver must)."""
    document = json.loads(body)
    for resource_spans in _items(document, "resourceSpans", "resource_spans"):
        for scope_spans in _items(resource_spans, "scopeSpans", "scope_spans"):
            for span in _items(scope_spans, "spans"):
                _hex_ids_to_base64(span, "traceId", "spanId", "parentSpanId")
                for link in _items(span, "links"):
                    _hex_ids_to_base64(link, "traceId", "spanId")
    return json_format.ParseDict(document, ExportTraceServiceRequest(), ignore_unknown_fields=True)


def _items(parent: object, *keys: str) -> list[Any]:
    """The objects in ``parent``'s list under the first of ``keys`` it has (OTLP/JSON uses
    lowerCamelCase; protobuf's parser also takes the proto field names)."""
    if not isinstance(parent, dict):
        raise TypeError(f"expected a JSON object, got {type(parent).__name__}")
    for key in keys:
        if key in parent:
            value = parent[key]
            if not isinstance(value, list):
                raise TypeError(f"{key} must be a JSON array")
            return value
    return []


def _hex_ids_to_base64(item: object, *keys: str) -> None:
    if not isinstance(item, dict):
        raise TypeError(f"expected a JSON object, got {type(item).__name__}")
    for key in keys:
        if isinstance(item.get(key), str):
            item[key] = base64.b64encode(bytes.fromhex(item[key])).decode("ascii")


def _spans_of(request: Any) -> list[ReceivedSpan]:
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = str(scope_spans.scope.name)
            spans.extend(_span(span, resource, scope) for span in scope_spans.spans)
    return spans


def _span(span: Any, resource: Attributes, scope: str) -> ReceivedSpan:
    parent = bytes(span.parent_span_id)
    return ReceivedSpan(
        name=str(span.name),
        trace_id=bytes(span.trace_id).hex(),
        span_id=bytes(span.span_id).hex(),
        parent_span_id=parent.hex() if parent else None,
        kind=_enum_name(Span.SpanKind, span.kind, "SPAN_KIND_"),
        start_ns=int(span.start_time_unix_nano),
        end_ns=int(span.end_time_unix_nano),
        attributes=_attributes(span.attributes),
        status_code=_enum_name(Status.StatusCode, span.status.code, "STATUS_CODE_"),
        status_message=str(span.status.message),
        events=tuple((str(event.name), _attributes(event.attributes)) for event in span.events),
        links=tuple(
            (bytes(link.trace_id).hex(), bytes(link.span_id).hex(), _attributes(link.attributes))
            for link in span.links
        ),
        # Each span gets its own copy, so one span's dict is not another's.
        resource=dict(resource),
        scope=scope,
    )


def _enum_name(enum: Any, number: int, prefix: str) -> str:
    """``SPAN_KIND_SERVER`` -> ``SERVER``; a number newer than these protos stays a number
    (proto3 enums are open) instead of failing the whole request."""
    try:
        return str(enum.Name(number)).removeprefix(prefix)
    except ValueError:
        return str(int(number))


def _attributes(pairs: Iterable[Any]) -> Attributes:
    return {str(pair.key): _value(pair.value) for pair in pairs}


def _value(value: Any) -> AttributeValue:
    """An ``AnyValue`` as Python, recursing through arrays and key/value lists."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return str(value.string_value)
    if which == "bool_value":
        return bool(value.bool_value)
    if which == "int_value":
        return int(value.int_value)
    if which == "double_value":
        return float(value.double_value)
    if which == "bytes_value":
        return bytes(value.bytes_value)
    if which == "array_value":
        return tuple(_value(item) for item in value.array_value.values)
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return None  # an empty AnyValue: the attribute was set without a value


def main() -> None:
    """``python -m tests.support.otlp``: a receiver that prints its endpoint and serves
    until interrupted (a benchmark's collector), then how many spans it took."""
    import signal

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with OtlpReceiver() as receiver:
        print(receiver.endpoint, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
        print(f"{len(receiver.spans())} spans in {receiver.requests} requests", flush=True)


if __name__ == "__main__":
    main()
