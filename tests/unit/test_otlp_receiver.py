"""The test OTLP receiver (``tests/support/otlp.py``) decodes what the standard
OpenTelemetry SDK and its OTLP/HTTP exporter really send: no part of the SDK is faked,
the spans cross a real loopback socket as protobuf, and each test checks ids, parents,
kinds, attributes, events, links, status and resource field by field."""

from __future__ import annotations

import gzip
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from tests.support.otlp import OtlpReceiver, ReceivedSpan, tree

SERVICE = "parley-otlp-receiver-test"
SCOPE = "tests.unit.test_otlp_receiver"


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exporter and the resource read OTEL_* variables (endpoint, compression,
    headers, service name); the tests say everything explicitly, whatever the shell has."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as server:
        yield server


def _provider(processor: SpanProcessor) -> TracerProvider:
    """A provider of the test's own (never the global one) exporting through ``processor``."""
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    provider.add_span_processor(processor)
    return provider


def _hex_trace(span: Span) -> str:
    return format(span.get_span_context().trace_id, "032x")


def _hex_span(span: Span) -> str:
    return format(span.get_span_context().span_id, "016x")


def _finished(span: Span) -> ReadableSpan:
    """The SDK's own record of an ended span, for its exact start and end times."""
    assert isinstance(span, ReadableSpan)
    return span


def _make_turn(provider: TracerProvider) -> dict[str, Span]:
    """A small trace like parley's: a linked earlier span, then a SERVER root with a
    CLIENT child (with an event and a link) and an INTERNAL grandchild that failed."""
    tracer = provider.get_tracer(SCOPE)
    with tracer.start_as_current_span("enqueue", kind=SpanKind.PRODUCER) as enqueue:
        pass
    with tracer.start_as_current_span(
        "turn",
        kind=SpanKind.SERVER,
        attributes={
            "parley.session": "s-1",
            "parley.turn": 3,
            "parley.temperature": 0.25,
            "parley.tools": ["read_file", "grep"],
        },
    ) as turn:
        turn.set_attribute("parley.streamed", True)
        with tracer.start_as_current_span(
            "llm.call",
            kind=SpanKind.CLIENT,
            links=[Link(enqueue.get_span_context(), {"link.reason": "queued"})],
        ) as call:
            call.set_attribute("llm.tokens", 1234)
            call.add_event("first_token", {"latency_ms": 87.5, "cached": False})
            with tracer.start_as_current_span("tool.run") as tool:
                tool.set_attribute("tool.name", "grep")
                tool.set_status(Status(StatusCode.ERROR, "tool failed"))
    return {"enqueue": enqueue, "turn": turn, "llm.call": call, "tool.run": tool}


def _check_turn(received: list[ReceivedSpan], made: dict[str, Span]) -> None:
    """The receiver holds exactly the spans ``_make_turn`` made, field by field."""
    by_name = {span.name: span for span in received}
    assert sorted(by_name) == sorted(made), tree(received)
    assert len(received) == len(made), tree(received)

    enqueue, turn, call, tool = (by_name[n] for n in ("enqueue", "turn", "llm.call", "tool.run"))
    for name, span in by_name.items():
        sdk = made[name]
        assert span.trace_id == _hex_trace(sdk)
        assert span.span_id == _hex_span(sdk)
        assert len(span.trace_id) == 32 and len(span.span_id) == 16
        assert (span.start_ns, span.end_ns) == (_finished(sdk).start_time, _finished(sdk).end_time)
        assert span.start_ns <= span.end_ns
        assert span.resource["service.name"] == SERVICE
        assert span.resource["telemetry.sdk.language"] == "python"
        assert span.scope == SCOPE

    # The parent chain: turn is a root, llm.call under it, tool.run under that; the
    # earlier span is a trace of its own.
    assert turn.parent_span_id is None and enqueue.parent_span_id is None
    assert call.parent_span_id == turn.span_id
    assert tool.parent_span_id == call.span_id
    assert turn.trace_id == call.trace_id == tool.trace_id != enqueue.trace_id

    assert [enqueue.kind, turn.kind, call.kind, tool.kind] == [
        "PRODUCER",
        "SERVER",
        "CLIENT",
        "INTERNAL",
    ]
    assert turn.attributes == {
        "parley.session": "s-1",
        "parley.turn": 3,
        "parley.temperature": 0.25,
        "parley.streamed": True,
        "parley.tools": ("read_file", "grep"),
    }
    assert call.attributes == {"llm.tokens": 1234}
    assert call.events == (("first_token", {"latency_ms": 87.5, "cached": False}),)
    assert call.links == ((enqueue.trace_id, enqueue.span_id, {"link.reason": "queued"}),)
    assert tool.attributes == {"tool.name": "grep"}
    assert (tool.status_code, tool.status_message) == ("ERROR", "tool failed")
    assert (turn.status_code, turn.status_message) == ("UNSET", "")
    assert turn.events == () and turn.links == ()


def test_simple_processor_exports_every_span_as_it_ends(receiver: OtlpReceiver) -> None:
    provider = _provider(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.traces_endpoint)))
    try:
        made = _make_turn(provider)
        received = receiver.wait_for(lambda spans: len(spans) >= 4)
    finally:
        provider.shutdown()

    _check_turn(received, made)
    # One export request per span, each ended before its parent.
    assert receiver.requests == 4
    assert receiver.rejected == 0
    assert [span.name for span in received] == ["enqueue", "tool.run", "llm.call", "turn"]
    assert receiver.encodings() == ["identity"] * 4

    trace = receiver.trace(_hex_trace(made["turn"]).upper())
    assert [span.name for span in trace] == ["turn", "llm.call", "tool.run"]
    assert [span.name for span in receiver.named("llm.")] == ["llm.call"]
    assert [span.name for span in receiver.named("turn")] == ["turn"]
    assert receiver.named("nothing") == []


def test_batch_processor_sends_one_request_on_force_flush(receiver: OtlpReceiver) -> None:
    # A schedule delay far longer than the test: only force_flush sends.
    processor = BatchSpanProcessor(
        OTLPSpanExporter(endpoint=receiver.traces_endpoint), schedule_delay_millis=60_000
    )
    provider = _provider(processor)
    try:
        made = _make_turn(provider)
        assert receiver.requests == 0
        assert provider.force_flush(timeout_millis=10_000)
        received = receiver.wait_for(lambda spans: len(spans) >= 4, timeout=10)
    finally:
        provider.shutdown()

    _check_turn(received, made)
    assert receiver.requests == 1


def test_gzip_compressed_exports_are_decoded(receiver: OtlpReceiver) -> None:
    exporter = OTLPSpanExporter(endpoint=receiver.traces_endpoint, compression=Compression.Gzip)
    provider = _provider(SimpleSpanProcessor(exporter))
    try:
        made = _make_turn(provider)
        received = receiver.wait_for(lambda spans: len(spans) >= 4)
    finally:
        provider.shutdown()

    _check_turn(received, made)
    assert receiver.encodings() == ["gzip"] * 4


def test_the_endpoint_is_what_otel_exporter_otlp_endpoint_wants(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Configured only by the environment, as a deployed parley is: the exporter appends
    /v1/traces to ``endpoint`` itself, and deflate is decoded too."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "deflate")
    assert receiver.traces_endpoint == receiver.endpoint + "/v1/traces"
    provider = _provider(SimpleSpanProcessor(OTLPSpanExporter()))
    try:
        made = _make_turn(provider)
        received = receiver.wait_for(lambda spans: len(spans) >= 4)
    finally:
        provider.shutdown()

    _check_turn(received, made)
    assert receiver.encodings() == ["deflate"] * 4


def test_otlp_json_is_decoded_with_hex_ids_and_nested_values(receiver: OtlpReceiver) -> None:
    """OTLP/JSON as the spec writes it: hex ids, enums as numbers, int64 as strings, and
    the AnyValue shapes the SDK never sends on a span (key/value lists, bytes, empties)."""
    trace_id = "5b8efff798038103d269b633813fc60c"
    parent_id, span_id = "eee19b7ec3c1b173", "eee19b7ec3c1b174"
    document = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "json-scope"},
                        "spans": [
                            {
                                "traceId": trace_id,
                                "spanId": span_id,
                                "parentSpanId": parent_id,
                                "name": "from-json",
                                "kind": 4,
                                "startTimeUnixNano": "1544712660000000000",
                                "endTimeUnixNano": "1544712661000000000",
                                "attributes": [
                                    {
                                        "key": "nested",
                                        "value": {
                                            "kvlistValue": {
                                                "values": [
                                                    {"key": "n", "value": {"intValue": "7"}},
                                                    {
                                                        "key": "xs",
                                                        "value": {
                                                            "arrayValue": {
                                                                "values": [
                                                                    {"doubleValue": 1.5},
                                                                    {"boolValue": True},
                                                                ]
                                                            }
                                                        },
                                                    },
                                                ]
                                            }
                                        },
                                    },
                                    {"key": "raw", "value": {"bytesValue": "AAE="}},
                                    {"key": "empty", "value": {}},
                                ],
                                "links": [{"traceId": trace_id, "spanId": parent_id}],
                                "status": {"code": 1},
                                "someFutureField": "ignored",
                            }
                        ],
                    }
                ],
            }
        ]
    }
    status, body, content_type = _request(
        receiver.traces_endpoint, json.dumps(document).encode(), "application/json"
    )
    assert (status, content_type) == (200, "application/json")
    assert json.loads(body) == {}

    assert receiver.spans() == [
        ReceivedSpan(
            name="from-json",
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id=parent_id,
            kind="PRODUCER",
            start_ns=1544712660000000000,
            end_ns=1544712661000000000,
            attributes={"nested": {"n": 7, "xs": (1.5, True)}, "raw": b"\x00\x01", "empty": None},
            status_code="OK",
            status_message="",
            events=(),
            links=((trace_id, parent_id, {}),),
            resource={"service.name": "json-svc"},
            scope="json-scope",
        )
    ]


def test_garbage_is_refused_and_nothing_is_stored(receiver: OtlpReceiver) -> None:
    assert _request(receiver.traces_endpoint, b"this is not a protobuf")[0] == 400
    assert _request(receiver.traces_endpoint, b"{not json", "application/json")[0] == 400
    bad_gzip = _request(receiver.traces_endpoint, b"not gzip", headers={"Content-Encoding": "gzip"})
    assert bad_gzip[0] == 400
    # Valid gzip of garbage still fails at the protobuf.
    gzipped = gzip.compress(b"this is not a protobuf")
    assert (
        _request(receiver.traces_endpoint, gzipped, headers={"Content-Encoding": "gzip"})[0] == 400
    )
    assert _request(receiver.traces_endpoint, b"x", "text/plain")[0] == 415

    assert receiver.spans() == []
    assert receiver.requests == 0
    assert receiver.rejected == 5


def test_other_methods_and_paths_are_refused(receiver: OtlpReceiver) -> None:
    assert _request(receiver.traces_endpoint, method="GET")[0] == 405
    assert _request(receiver.endpoint + "/v1/metrics", b"")[0] == 404
    assert _request(receiver.endpoint + "/", method="GET")[0] == 404
    assert receiver.requests == receiver.rejected == 0


def test_wait_for_times_out_with_what_arrived(receiver: OtlpReceiver) -> None:
    provider = _provider(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.traces_endpoint)))
    try:
        made = _make_turn(provider)
    finally:
        provider.shutdown()

    with pytest.raises(AssertionError) as caught:
        receiver.wait_for(lambda spans: any(s.name == "never" for s in spans), timeout=0.2)
    message = str(caught.value)
    assert "4 span(s) in 4 request(s)" in message
    assert f"trace {_hex_trace(made['turn'])}" in message
    # The tree nests the child under its parent, and shows the error.
    assert "\n  turn [SERVER]" in message
    assert "\n    llm.call [CLIENT]" in message
    assert "\n      tool.run [INTERNAL]" in message and "ERROR: tool failed" in message

    receiver.clear()
    assert receiver.spans() == [] and receiver.requests == 0 and receiver.encodings() == []


def test_close_releases_the_port_and_is_idempotent() -> None:
    receiver = OtlpReceiver()
    receiver.close()  # never started: nothing to do
    with pytest.raises(RuntimeError):
        _ = receiver.endpoint
    receiver.start()
    endpoint = receiver.endpoint
    receiver.close()
    receiver.close()
    with pytest.raises(urllib.error.URLError):
        _request(endpoint + "/v1/traces", b"")


def _request(
    url: str,
    body: bytes | None = None,
    content_type: str = "application/x-protobuf",
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> tuple[int, bytes, str]:
    """Send one request (never through a proxy); returns status, body and content type."""
    request = urllib.request.Request(
        url,
        data=body,
        method=method,
        headers={"Content-Type": content_type, **(headers or {})},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        try:
            return error.code, error.read(), error.headers.get("Content-Type", "")
        finally:
            error.close()
