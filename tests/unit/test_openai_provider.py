"""OpenAIChatModel against a real OpenAI-compatible HTTP server on loopback: streaming,
tool-call assembly, usage, the client's own retries (never of a 429: those are parley's),
rate limits and quota, mid-stream failures, encoding, and one whole parley turn over it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import parley
from parley.errors import InvalidRequest
from parley.models import Backoff, Fallover, OpenAIChatModel, ProviderError
from parley.models.errors import RateLimited
from parley.ports.admission import Limits, ProviderReport
from parley.ports.host import ModelRequest, ModelThrottled, StreamAborted
from parley.schemas.events import Event, EventKind
from parley.schemas.messages import (
    AssistantMessage,
    Message,
    Prefix,
    ToolCall,
    ToolDeclaration,
    ToolMessage,
    UserMessage,
)
from parley.schemas.records import Usage
from tests.providers.servers import (
    ProviderServer,
    Reply,
    openai_chunk,
    openai_server,
    openai_text,
    openai_tool_calls,
    sse,
)
from tests.providers.sink import RecordingSink

KEY = "sk-test-0123456789abcdef"

READ_FILE = ToolDeclaration(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
PREFIX = Prefix(system_prompt="You are terse.", tools=(READ_FILE,))


def request(*messages: Message, prefix: Prefix = PREFIX) -> ModelRequest:
    return ModelRequest(prefix=prefix, messages=messages or (UserMessage(text="hi"),))


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with openai_server() as running:
        yield running


ModelFactory = Callable[..., OpenAIChatModel]


@pytest.fixture
def make_model(server: ProviderServer) -> Iterator[ModelFactory]:
    made: list[OpenAIChatModel] = []

    def make(**options: Any) -> OpenAIChatModel:
        settings: dict[str, Any] = {
            "base_url": server.base_url,
            "api_key": KEY,
            "timeout": 2.0,
            "max_retries": 0,
        }
        settings.update(options)
        model = OpenAIChatModel("gpt-test", **settings)
        made.append(model)
        return model

    yield make
    for model in made:
        model.close()


# ---------------------------------------------------------------------------- streaming


def test_text_arrives_delta_by_delta_before_the_stream_ends(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    # The server holds the rest of the stream until the sink has seen the first delta: if
    # deltas were buffered to the end, the gate would never open and the server cuts.
    gate = threading.Event()
    frames = openai_text("Hel", "lo, ", "wor", "ld")
    server.plan(Reply(frames=frames, gate=gate, gate_at=2, gate_timeout=5.0))
    arrivals: list[tuple[str, bool]] = []

    def arrived(text: str) -> None:
        arrivals.append((text, gate.is_set()))
        gate.set()

    sink = RecordingSink(on_delta=arrived)

    reply = make_model().stream(request(), sink)

    assert sink.deltas == ["Hel", "lo, ", "wor", "ld"]
    assert arrivals[0] == ("Hel", False)  # delivered while the server was still waiting
    assert reply.text == "Hello, world"
    assert reply.model == "openai:gpt-test"
    assert sink.restarts == []


def test_usage_is_recorded_with_cached_tokens(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=openai_text("ok", usage=(1200, 7, 1024))))
    reply = make_model().stream(request(), RecordingSink())
    assert reply.usage == Usage(input_tokens=1200, output_tokens=7, cached_tokens=1024)
    sent = server.received[0].json()
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


def test_a_server_that_reports_no_usage_gets_an_estimate(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=openai_text("some answer", usage=None)))
    reply = make_model().stream(request(), RecordingSink())
    assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0


def test_tool_calls_split_across_chunks_are_assembled(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(
            frames=openai_tool_calls(
                [
                    ("call_a", "read_file", ['{"pa', 'th": "RE', 'ADME.md"}']),
                    ("call_b", "list_files", ["{", '"path"', ': "sr', 'c"}']),
                    ("call_c", "list_files", []),
                ],
                text=["Looking", " around."],
            )
        )
    )
    sink = RecordingSink()
    reply = make_model().stream(request(), sink)
    assert sink.deltas == ["Looking", " around."]
    assert reply.text == "Looking around."
    assert reply.tool_calls == (
        ToolCall(id="call_a", name="read_file", arguments='{"path": "README.md"}'),
        ToolCall(id="call_b", name="list_files", arguments='{"path": "src"}'),
        ToolCall(id="call_c", name="list_files", arguments="{}"),
    )
    assert reply.usage == Usage(input_tokens=30, output_tokens=9)


def test_tool_calls_interleaved_by_index_are_kept_apart(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    def fragment(index: int, **function: str) -> dict[str, Any]:
        return {"index": index, "function": function}

    frames = [
        openai_chunk(
            tool_calls=[
                {"index": 0, "id": "c0", "type": "function", "function": {"name": "read_file"}},
                {"index": 1, "id": "c1", "type": "function", "function": {"name": "read_file"}},
            ]
        ),
        openai_chunk(tool_calls=[fragment(1, arguments='{"path":')]),
        openai_chunk(tool_calls=[fragment(0, arguments='{"path":')]),
        openai_chunk(tool_calls=[fragment(0, arguments=' "a"}'), fragment(1, arguments=' "b"}')]),
        openai_chunk(finish="tool_calls"),
        sse("[DONE]"),
    ]
    server.plan(Reply(frames=frames))
    reply = make_model().stream(request(), RecordingSink())
    assert [(c.id, c.arguments) for c in reply.tool_calls] == [
        ("c0", '{"path": "a"}'),
        ("c1", '{"path": "b"}'),
    ]


# ---------------------------------------------------------------------------- the client's retries


RATE_HEADERS = {
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-limit-tokens": "200000",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-remaining-tokens": "199000",
    "x-ratelimit-reset-requests": "120ms",
    "x-ratelimit-reset-tokens": "300ms",
}


def test_a_429_reaches_the_server_once_and_is_raised_with_its_delay_and_limits(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    # The client would retry a 429 by itself, asleep inside a worker's slot: it must not.
    server.plan(
        Reply(
            status=429,
            headers={"Retry-After": "1", **RATE_HEADERS},
            body={"error": {"message": "slow down", "type": "requests"}},
        ),
        Reply(frames=openai_text("never asked for")),
    )
    started = time.monotonic()
    with pytest.raises(RateLimited) as caught:
        make_model(max_retries=2).stream(request(), RecordingSink())
    assert time.monotonic() - started < 1.0  # nobody slept through the retry-after
    error = caught.value
    assert isinstance(error, ModelThrottled) and isinstance(error, ProviderError)
    assert (error.status, error.phase, error.retriable) == (429, "request", False)
    assert error.retry_after == 1.0
    assert error.limits == Limits(rpm=500, tpm=200_000)
    assert "HTTP 429: slow down" in str(error) and "retry after 1s" in str(error)
    assert len(server.received) == 1 and server.pending() == 1


def test_a_429_without_retry_after_waits_for_its_exhausted_bucket(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(status=429, headers=RATE_HEADERS, body={"error": {"message": "slow down"}}))
    with pytest.raises(RateLimited) as caught:
        make_model(max_retries=2).stream(request(), RecordingSink())
    # The requests bucket is the empty one: its reset, not the tokens'.
    assert caught.value.retry_after == pytest.approx(0.12)
    assert len(server.received) == 1


def test_a_503_is_still_retried_by_the_client(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(status=503, headers={"retry-after-ms": "10"}, body={"error": {"message": "busy"}}),
        Reply(frames=openai_text("fine")),
    )
    reply = make_model(max_retries=2).stream(request(), RecordingSink())
    assert reply.text == "fine"
    assert [r.headers["x-stainless-retry-count"] for r in server.received] == ["0", "1"]


def test_insufficient_quota_fails_at_once_saying_so(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(
            status=429,
            headers={"retry-after": "1", **RATE_HEADERS},
            body={
                "error": {
                    "message": "You exceeded your current quota, please check your plan.",
                    "type": "insufficient_quota",
                    "param": None,
                    "code": "insufficient_quota",
                }
            },
        )
    )
    with pytest.raises(ProviderError) as caught:
        make_model(max_retries=2).stream(request(), RecordingSink())
    error = caught.value
    assert not isinstance(error, RateLimited) and not isinstance(error, ModelThrottled)
    assert (error.status, error.retriable) == (429, False)
    assert "quota (credit) is exhausted" in str(error) and "retrying will not help" in str(error)
    assert "You exceeded your current quota" in str(error)
    assert len(server.received) == 1


def test_a_reply_carries_the_limits_its_headers_reported(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(frames=openai_text("ok"), headers=RATE_HEADERS),
        Reply(frames=openai_text("ok")),
    )
    model = make_model()
    assert model.stream(request(), RecordingSink()).limits == Limits(rpm=500, tpm=200_000)
    assert model.stream(request(), RecordingSink()).limits is None  # a server that sends none


def test_what_the_headers_say_reaches_the_sink_before_the_first_delta(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(frames=openai_text("ok"), headers=RATE_HEADERS),
        Reply(frames=openai_text("ok")),
    )
    model = make_model()
    told, silent = RecordingSink(), RecordingSink()
    model.stream(request(), told)
    model.stream(request(), silent)
    assert told.reports == [
        (
            ProviderReport(
                limits=Limits(rpm=500, tpm=200_000),
                requests_remaining=0,
                tokens_remaining=199_000,
            ),
            0,  # deltas before it
        )
    ]
    assert silent.reports == [(ProviderReport(), 0)]


def test_the_output_ceiling_is_the_max_tokens_the_request_sends(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    assert make_model().output_ceiling is None
    assert make_model(extra_body={"max_tokens": 300}).output_ceiling == 300
    capped = make_model(extra_body={"max_completion_tokens": 700, "temperature": 0})
    assert capped.output_ceiling == 700
    server.plan(Reply(frames=openai_text("ok")))
    capped.stream(request(), RecordingSink())
    assert server.received[0].json()["max_completion_tokens"] == 700
    for bad in (0, -1, "300", 2.5, True):
        with pytest.raises(InvalidRequest, match="positive whole number"):
            make_model(extra_body={"max_tokens": bad})


def test_a_server_error_that_outlasts_the_client_retries_is_final_for_the_provider(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    busy = Reply(
        status=503, headers={"retry-after-ms": "10"}, body={"error": {"message": "overloaded"}}
    )
    server.plan(busy, busy, busy)
    with pytest.raises(ProviderError) as caught:
        make_model(max_retries=2).stream(request(), RecordingSink())
    error = caught.value
    assert (error.status, error.phase, error.retriable) == (503, "request", False)
    assert "HTTP 503: overloaded" in str(error) and "2 retries" in str(error)
    assert len(server.received) == 3


def test_a_rejected_request_is_not_retried(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(status=400, body={"error": {"message": "context too long"}}))
    with pytest.raises(ProviderError) as caught:
        make_model(max_retries=2).stream(request(), RecordingSink())
    assert (caught.value.status, caught.value.retriable) == (400, False)
    assert "context too long" in str(caught.value)
    assert len(server.received) == 1


def test_a_server_too_slow_to_answer_hits_the_timeout(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(delay=3.0, frames=openai_text("late")))
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        make_model(timeout=0.3).stream(request(), RecordingSink())
    assert time.monotonic() - started < 2.0
    assert (caught.value.phase, caught.value.retriable) == ("request", False)
    assert "no response within 0.3s" in str(caught.value)


# ---------------------------------------------------------------------------- mid-stream failures


def test_a_stream_cut_mid_way_is_a_retriable_error(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=openai_text("Hel", "lo"), cut_after=2))
    sink = RecordingSink()
    with pytest.raises(ProviderError) as caught:
        make_model().stream(request(), sink)
    assert sink.deltas == ["Hel"]
    assert (caught.value.phase, caught.value.retriable) == ("stream", True)
    assert "the stream was cut" in str(caught.value)


def test_a_stream_that_ends_without_finishing_is_a_retriable_error(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    # A clean end of the body, but no finish_reason: the answer is incomplete.
    server.plan(Reply(frames=[openai_chunk(content="Hel")]))
    with pytest.raises(ProviderError) as caught:
        make_model().stream(request(), RecordingSink())
    assert caught.value.retriable and "before the answer was finished" in str(caught.value)


def test_a_malformed_chunk_is_a_retriable_error(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=[openai_chunk(content="Hel"), b"data: {not json\n\n"]))
    sink = RecordingSink()
    with pytest.raises(ProviderError) as caught:
        make_model().stream(request(), sink)
    assert sink.deltas == ["Hel"]
    assert (caught.value.phase, caught.value.retriable) == ("stream", True)
    assert "malformed chunk" in str(caught.value)


def test_an_error_chunk_mid_stream_is_a_retriable_error(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(frames=[openai_chunk(content="Hel"), sse({"error": {"message": "upstream died"}})])
    )
    with pytest.raises(ProviderError) as caught:
        make_model().stream(request(), RecordingSink())
    assert caught.value.retriable and "upstream died" in str(caught.value)


def test_a_stream_that_stalls_past_the_timeout_is_a_retriable_error(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=openai_text("Hel", "lo"), gaps={2: 3.0}))
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        make_model(timeout=0.3).stream(request(), RecordingSink())
    assert time.monotonic() - started < 2.0
    assert (caught.value.phase, caught.value.retriable) == ("stream", True)
    assert "stalled" in str(caught.value)


def test_an_interrupt_from_the_sink_propagates_and_is_not_retried(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=openai_text("one", "two", "three")), Reply(frames=openai_text("x")))
    model = Fallover([make_model()], backoff=Backoff(initial=0.01))
    sink = RecordingSink(abort_after=1)
    with pytest.raises(StreamAborted):
        model.stream(request(), sink)
    assert sink.deltas == ["one"] and sink.restarts == []
    assert len(server.received) == 1
    # The aborted stream was closed: the model still answers the next call.
    assert model.stream(request(), RecordingSink()).text == "x"


# ---------------------------------------------------------------------------- encoding


def test_messages_are_encoded_natively(server: ProviderServer, make_model: ModelFactory) -> None:
    server.plan(Reply(frames=openai_text("done")))
    calls = (
        ToolCall(id="call_1", name="read_file", arguments='{"path": "a.txt"}'),
        ToolCall(id="call_2", name="read_file", arguments='{"path": "secret"}'),
    )
    make_model().stream(
        request(
            UserMessage(text="read both"),
            AssistantMessage(text="Reading.", tool_calls=calls),
            ToolMessage(call_id="call_1", name="read_file", content="A"),
            ToolMessage(call_id="call_2", name="read_file", content="denied", is_error=True),
            UserMessage(text="only the first", origin="steer"),
            AssistantMessage(text="", tool_calls=calls[:1]),
            ToolMessage(call_id="call_1", name="read_file", content="A"),
        ),
        RecordingSink(),
    )
    body = server.received[0].json()
    assert body["model"] == "gpt-test"
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "read both"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "secret"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "A"},
        {"role": "tool", "tool_call_id": "call_2", "content": "denied"},
        {"role": "user", "content": "only the first"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "A"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"properties": {"path": {"type": "string"}}, "type": "object"},
            },
        }
    ]


def test_equal_prefixes_are_byte_identical_on_the_wire(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    # The same prefix built twice, its schema keys in another order (as after a round trip
    # through a database): the bytes sent must not differ, or the prompt cache misses.
    reordered = Prefix(
        system_prompt="You are terse.",
        tools=(
            ToolDeclaration(
                name="read_file",
                description="Read a file.",
                parameters={"properties": {"path": {"type": "string"}}, "type": "object"},
            ),
        ),
    )
    server.plan(*(Reply(frames=openai_text("ok")) for _ in range(3)))
    model = make_model()
    first = (UserMessage(text="hi"),)
    model.stream(request(*first), RecordingSink())
    model.stream(request(*first, prefix=reordered), RecordingSink())
    longer = (*first, AssistantMessage(text="ok"), UserMessage(text="more"))
    model.stream(request(*longer, prefix=reordered), RecordingSink())
    bodies = [r.body for r in server.received]
    assert bodies[0] == bodies[1]

    def prefix_bytes(body: bytes) -> tuple[bytes, bytes]:
        system = body[body.index(b'"messages":[') :].split(b"},", 1)[0]
        return system, body[body.index(b'"tools":') :]

    assert prefix_bytes(bodies[0]) == prefix_bytes(bodies[2])
    assert b'"content":"You are terse."' in prefix_bytes(bodies[2])[0]


# ---------------------------------------------------------------------------- credentials


def test_the_key_is_never_shown(server: ProviderServer, make_model: ModelFactory) -> None:
    server.plan(Reply(status=401, echo_key=True))
    model = make_model()
    assert KEY not in repr(model) and KEY not in str(model)
    with pytest.raises(ProviderError) as caught:
        model.stream(request(), RecordingSink())
    assert caught.value.status == 401
    assert "bad key" in str(caught.value)
    assert KEY not in str(caught.value) and "[redacted]" in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    assert server.received[0].headers["authorization"] == f"Bearer {KEY}"


def test_a_missing_key_is_refused_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(InvalidRequest, match="api_key"):
        OpenAIChatModel("gpt-test", base_url="http://127.0.0.1:9/v1")


def test_credentials_in_the_base_url_are_not_shown() -> None:
    model = OpenAIChatModel("gpt-test", api_key=KEY, base_url="http://user:hunter22@127.0.0.1:9/v1")
    try:
        assert "hunter22" not in repr(model) and "127.0.0.1:9" in repr(model)
    finally:
        model.close()


# ---------------------------------------------------------------------------- a whole turn


def test_a_parley_turn_streams_calls_a_tool_and_survives_a_cut_stream(
    server: ProviderServer, make_model: ModelFactory, tmp_path: Path
) -> None:
    root = tmp_path / "work"
    root.mkdir()
    (root / "a.txt").write_text("A\n")
    (root / "b.txt").write_text("B\n")
    server.plan(
        # Step 0: a little text, then a list_files call split mid-JSON.
        Reply(
            frames=openai_tool_calls(
                [("call_ls", "list_files", ['{"pa', 'th": "."}'])], text=["Let me ", "look."]
            )
        ),
        # Step 1: cut after two text deltas, then the whole answer on the retry.
        Reply(frames=openai_text("There ", "might ", "be"), cut_after=3),
        Reply(frames=openai_text("There are ", "two files.")),
    )
    model = Fallover([make_model()], backoff=Backoff(initial=0.01))
    client = parley.connect(
        "sqlite:///" + str(tmp_path / "db.sqlite"), host=parley.Host(model=model)
    )
    try:
        session = client.open_session(root=str(root))
        events: list[Event] = []
        result = session.turn("what is here?", on_event=events.append, timeout=30)
    finally:
        client.close()

    assert result.outcome == "finished", result
    assert result.reply == "There are two files."
    kinds = [e.kind for e in events]
    assert kinds[0] is EventKind.QUEUED and kinds[-1] is EventKind.END
    step0 = [e.data["text"] for e in events if e.kind is EventKind.TOKEN and e.data["step"] == 0]
    assert step0 == ["Let me ", "look."]
    (call,) = [e.data for e in events if e.kind is EventKind.TOOL_CALL]
    assert (call["name"], call["arguments"]) == ("list_files", '{"path": "."}')
    (result_event,) = [e.data for e in events if e.kind is EventKind.TOOL_RESULT]
    assert "a.txt" in result_event["content"] and "b.txt" in result_event["content"]
    assert not result_event["is_error"]

    # Step 1: the cut attempt's tokens, then step_restarted, then only the redone tokens.
    step1 = [
        e
        for e in events
        if (e.kind is EventKind.TOKEN and e.data["step"] == 1) or e.kind is EventKind.STEP_RESTARTED
    ]
    assert [(e.kind, e.data.get("text")) for e in step1] == [
        (EventKind.TOKEN, "There "),
        (EventKind.TOKEN, "might "),
        (EventKind.STEP_RESTARTED, None),
        (EventKind.TOKEN, "There are "),
        (EventKind.TOKEN, "two files."),
    ]
    restarted = next(e for e in step1 if e.kind is EventKind.STEP_RESTARTED)
    assert restarted.data["index"] == 1 and restarted.data["reason"] == "retry"
    steps = [e.data for e in events if e.kind is EventKind.STEP]
    assert [s["text"] for s in steps] == ["Let me look.", "There are two files."]
    assert steps[0]["tool_calls"][0]["id"] == "call_ls"
    assert [r.headers.get("x-stainless-retry-count") for r in server.received] == ["0"] * 3

    # The second request replays the tool round natively.
    replay = server.received[1].json()["messages"]
    assert replay[-2]["tool_calls"][0]["function"] == {
        "name": "list_files",
        "arguments": '{"path": "."}',
    }
    assert replay[-1]["role"] == "tool" and replay[-1]["tool_call_id"] == "call_ls"
    assert json.loads(server.received[2].body) == json.loads(server.received[1].body)


def test_a_strict_server_refuses_an_unanswered_tool_call_as_openai_does() -> None:
    # The approval tests trust a strict server to refuse orphan calls: it must.
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    asked = {"role": "assistant", "content": None, "tool_calls": [call]}
    answered = {"role": "tool", "tool_call_id": "call_1", "content": "done"}
    with openai_server(strict=True) as strict:
        strict.plan(Reply(frames=openai_text("fine")))
        client = openai.OpenAI(base_url=strict.base_url, api_key=KEY, max_retries=0)
        create: Any = client.chat.completions.create  # messages of any shape, on purpose
        for messages, fault in [
            ([{"role": "user", "content": "hi"}, asked], "did not have response messages: call_1"),
            ([{"role": "user", "content": "hi"}, answered], "must be a response to a preceeding"),
            (
                [{"role": "user", "content": "hi"}, asked, {"role": "user", "content": "and?"}],
                "call_1",
            ),
            ([{"role": "tool", "content": "no id"}], "not chat-completions messages"),
        ]:
            with pytest.raises(openai.BadRequestError, match=fault):
                create(model="gpt-test", messages=messages)
        stream = create(
            model="gpt-test",
            messages=[{"role": "user", "content": "hi"}, asked, answered],
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "fine"
        client.close()
        assert strict.pending() == 0 and len(strict.received) == 5
