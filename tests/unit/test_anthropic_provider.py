"""AnthropicModel against a real Anthropic Messages HTTP server on loopback: streaming,
tool_use assembly, usage with cache reads, the client's own retries (never of a 429: those
are parley's), rate limits and exhausted credit, mid-stream failures and the native
encoding."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest
from parley.models import AnthropicModel, Backoff, Fallover, ProviderError
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
from tests.providers.servers import ProviderServer, Reply, anthropic_message, anthropic_server, sse
from tests.providers.sink import RecordingSink

KEY = "sk-ant-test-0123456789abcdef"

READ_FILE = ToolDeclaration(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)
PREFIX = Prefix(system_prompt="You are terse.", tools=(READ_FILE,))
CACHE = {"type": "ephemeral"}


def request(*messages: Message, prefix: Prefix = PREFIX) -> ModelRequest:
    return ModelRequest(prefix=prefix, messages=messages or (UserMessage(text="hi"),))


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with anthropic_server() as running:
        yield running


ModelFactory = Callable[..., AnthropicModel]


@pytest.fixture
def make_model(server: ProviderServer) -> Iterator[ModelFactory]:
    made: list[AnthropicModel] = []

    def make(**options: Any) -> AnthropicModel:
        settings: dict[str, Any] = {
            "base_url": server.base_url,
            "api_key": KEY,
            "timeout": 2.0,
            "max_retries": 0,
        }
        settings.update(options)
        model = AnthropicModel("claude-test", **settings)
        made.append(model)
        return model

    yield make
    for model in made:
        model.close()


# ---------------------------------------------------------------------------- streaming


def test_text_arrives_delta_by_delta_before_the_stream_ends(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    gate = threading.Event()
    frames = anthropic_message("Hel", "lo, ", "world")
    # Frames: message_start, ping, block start, "Hel", then the gate.
    server.plan(Reply(frames=frames, gate=gate, gate_at=4))
    arrivals: list[tuple[str, bool]] = []

    def arrived(text: str) -> None:
        arrivals.append((text, gate.is_set()))
        gate.set()

    sink = RecordingSink(on_delta=arrived)

    reply = make_model().stream(request(), sink)

    assert sink.deltas == ["Hel", "lo, ", "world"]
    assert arrivals[0] == ("Hel", False)
    assert reply.text == "Hello, world"
    assert reply.model == "anthropic:claude-test"


def test_usage_counts_cache_reads_and_writes_as_input(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=anthropic_message("ok", usage=(50, 9, 1000, 200))))
    reply = make_model().stream(request(), RecordingSink())
    assert reply.usage == Usage(input_tokens=1250, output_tokens=9, cached_tokens=1000)


def test_tool_uses_split_across_deltas_are_assembled(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(
            frames=anthropic_message(
                "Let me look.",
                tool_uses=[
                    ("toolu_1", "read_file", ['{"pa', 'th": "RE', 'ADME.md"}']),
                    ("toolu_2", "list_files", ["{", '"path"', ': "sr', 'c"}']),
                    ("toolu_3", "list_files", []),
                ],
            )
        )
    )
    sink = RecordingSink()
    reply = make_model().stream(request(), sink)
    assert sink.deltas == ["Let me look."]
    assert reply.tool_calls == (
        ToolCall(id="toolu_1", name="read_file", arguments='{"path": "README.md"}'),
        ToolCall(id="toolu_2", name="list_files", arguments='{"path": "src"}'),
        ToolCall(id="toolu_3", name="list_files", arguments="{}"),
    )


# ---------------------------------------------------------------------------- the client's retries


# Anthropic's headers, as a 200 from api.anthropic.com carries them (the tokens limit is
# input and output together: 80000 + 16000).
def rate_headers() -> dict[str, str]:
    """Anthropic's rate-limit headers as it sends them, every bucket resetting 30 s from
    now (made when the test runs: a reset computed at import has passed by the time a
    long suite reaches the test)."""
    reset = (datetime.now(UTC) + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "anthropic-ratelimit-requests-limit": "1000",
        "anthropic-ratelimit-requests-remaining": "999",
        "anthropic-ratelimit-requests-reset": reset,
        "anthropic-ratelimit-tokens-limit": "96000",
        "anthropic-ratelimit-tokens-remaining": "0",
        "anthropic-ratelimit-tokens-reset": reset,
        "anthropic-ratelimit-input-tokens-limit": "80000",
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": reset,
        "anthropic-ratelimit-output-tokens-limit": "16000",
        "anthropic-ratelimit-output-tokens-remaining": "16000",
        "anthropic-ratelimit-output-tokens-reset": reset,
    }


def error_body(kind: str, message: str, code: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": kind, "message": message}
    if code is not None:
        error["details"] = {"error_code": code}
    return {"type": "error", "error": error, "request_id": "req_011"}


def test_a_429_reaches_the_server_once_and_is_raised_with_its_delay_and_limits(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(
            status=429,
            headers={"retry-after": "7", "x-should-retry": "true", **rate_headers()},
            body=error_body("rate_limit_error", "Number of request tokens has exceeded"),
        ),
        Reply(frames=anthropic_message("never asked for")),
    )
    started = time.monotonic()
    with pytest.raises(RateLimited) as caught:
        make_model(max_retries=2).stream(request(), RecordingSink())
    assert time.monotonic() - started < 2.0
    error = caught.value
    assert isinstance(error, ModelThrottled)
    assert (error.status, error.retriable, error.retry_after) == (429, False, 7.0)
    assert error.limits == Limits(rpm=1000, tpm=96_000)
    assert len(server.received) == 1 and server.pending() == 1


def test_a_429_without_retry_after_waits_for_the_reset_of_its_exhausted_bucket(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(
            status=429,
            headers=rate_headers(),
            body=error_body("rate_limit_error", "ramping", code="ramp_limit_exceeded"),
        )
    )
    with pytest.raises(RateLimited) as caught:
        make_model(max_retries=2).stream(request(), RecordingSink())
    assert caught.value.retry_after is not None and 25 < caught.value.retry_after <= 30
    assert len(server.received) == 1


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (
            400,
            error_body(
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API. "
                "Please go to Plans & Billing to upgrade or purchase credits.",
            ),
        ),
        (402, error_body("billing_error", "There is an issue with your billing.")),
        (
            429,
            error_body(
                "rate_limit_error",
                "Monthly usage threshold reached.",
                code="enforced_spend_limit_reached",
            ),
        ),
    ],
    ids=["credit-too-low", "billing-error", "spend-limit"],
)
def test_an_exhausted_credit_fails_at_once_saying_so(
    server: ProviderServer, make_model: ModelFactory, status: int, body: dict[str, Any]
) -> None:
    server.plan(Reply(status=status, headers={"retry-after": "1"}, body=body))
    with pytest.raises(ProviderError) as caught:
        make_model(max_retries=2).stream(request(), RecordingSink())
    error = caught.value
    assert not isinstance(error, ModelThrottled)
    assert (error.status, error.retriable) == (status, False)
    assert "quota (credit) is exhausted" in str(error) and "retrying will not help" in str(error)
    assert body["error"]["message"] in str(error)
    assert len(server.received) == 1


def test_an_overloaded_server_is_still_retried_by_the_client(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(
            status=529,
            headers={"retry-after-ms": "10"},
            body=error_body("overloaded_error", "Overloaded"),
        ),
        Reply(frames=anthropic_message("fine")),
    )
    assert make_model(max_retries=2).stream(request(), RecordingSink()).text == "fine"
    assert len(server.received) == 2


def test_a_reply_carries_the_limits_its_headers_reported(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    only_split = {
        name: value for name, value in rate_headers().items() if "-ratelimit-tokens-" not in name
    }
    server.plan(
        Reply(frames=anthropic_message("ok"), headers=rate_headers()),
        Reply(frames=anthropic_message("ok"), headers=only_split),
        Reply(frames=anthropic_message("ok")),
    )
    model = make_model(max_tokens=900)
    assert model.output_ceiling == 900
    assert model.stream(request(), RecordingSink()).limits == Limits(rpm=1000, tpm=96_000)
    # Without the combined figure, the input-tokens limit stands for tpm.
    assert model.stream(request(), RecordingSink()).limits == Limits(rpm=1000, tpm=80_000)
    assert model.stream(request(), RecordingSink()).limits is None


def test_what_the_headers_say_reaches_the_sink_before_the_first_delta(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=anthropic_message("ok"), headers=rate_headers()))
    sink = RecordingSink()
    make_model().stream(request(), sink)
    report = ProviderReport(
        limits=Limits(rpm=1000, tpm=96_000), requests_remaining=999, tokens_remaining=0
    )
    assert sink.reports == [(report, 0)]


def test_a_retry_after_beyond_the_cap_fails_over_instead_of_sleeping(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(
        Reply(
            status=503,
            headers={"Retry-After": "3600"},
            body=error_body("api_error", "down for maintenance"),
        )
    )
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        make_model(max_retries=2).stream(request(), RecordingSink())
    assert time.monotonic() - started < 2.0
    assert (caught.value.status, caught.value.retriable) == (503, False)
    assert "3600s" in str(caught.value)
    assert len(server.received) == 1


def test_an_overloaded_server_outlasting_the_client_retries_is_final(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    overloaded = Reply(
        status=529,
        headers={"retry-after-ms": "10"},
        body={"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    server.plan(overloaded, overloaded)
    with pytest.raises(ProviderError) as caught:
        make_model(max_retries=1).stream(request(), RecordingSink())
    assert (caught.value.status, caught.value.phase, caught.value.retriable) == (
        529,
        "request",
        False,
    )
    assert "Overloaded" in str(caught.value)
    assert len(server.received) == 2


def test_a_server_too_slow_to_answer_hits_the_timeout(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(delay=3.0, frames=anthropic_message("late")))
    started = time.monotonic()
    with pytest.raises(ProviderError) as caught:
        make_model(timeout=0.3).stream(request(), RecordingSink())
    assert time.monotonic() - started < 2.0
    assert "no response within 0.3s" in str(caught.value)


# ---------------------------------------------------------------------------- mid-stream failures


def test_a_stream_cut_mid_way_is_a_retriable_error(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=anthropic_message("Hel", "lo"), cut_after=4))
    sink = RecordingSink()
    with pytest.raises(ProviderError) as caught:
        make_model().stream(request(), sink)
    assert sink.deltas == ["Hel"]
    assert (caught.value.phase, caught.value.retriable) == ("stream", True)


def test_a_stream_without_message_stop_is_a_retriable_error(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=anthropic_message("Hel", stop=False)))
    with pytest.raises(ProviderError) as caught:
        make_model().stream(request(), RecordingSink())
    assert caught.value.retriable and "message_stop" in str(caught.value)


def test_a_malformed_event_is_a_retriable_error(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    frames = anthropic_message("Hel", "lo")
    frames.insert(4, b"event: content_block_delta\ndata: {oops\n\n")
    server.plan(Reply(frames=frames))
    with pytest.raises(ProviderError) as caught:
        make_model().stream(request(), RecordingSink())
    assert caught.value.retriable and "malformed event" in str(caught.value)


def test_error_events_mid_stream_are_classified(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    def error_event(kind: str) -> bytes:
        return sse({"type": "error", "error": {"type": kind, "message": kind}}, "error")

    start = anthropic_message("Hel")[:4]
    server.plan(
        Reply(frames=[*start, error_event("overloaded_error")]),
        Reply(frames=[*start, error_event("invalid_request_error")]),
    )
    model = make_model()
    with pytest.raises(ProviderError) as overloaded:
        model.stream(request(), RecordingSink())
    assert overloaded.value.retriable and "overloaded_error" in str(overloaded.value)
    with pytest.raises(ProviderError) as invalid:
        model.stream(request(), RecordingSink())
    assert not invalid.value.retriable


def test_a_stream_that_stalls_past_the_timeout_is_a_retriable_error(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=anthropic_message("Hel", "lo"), gaps={4: 3.0}))
    with pytest.raises(ProviderError) as caught:
        make_model(timeout=0.3).stream(request(), RecordingSink())
    assert (caught.value.phase, caught.value.retriable) == ("stream", True)
    assert "stalled" in str(caught.value)


def test_an_interrupt_from_the_sink_propagates_and_is_not_retried(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=anthropic_message("one", "two")), Reply(frames=anthropic_message("x")))
    model = Fallover([make_model()], backoff=Backoff(initial=0.01))
    sink = RecordingSink(abort_after=1)
    with pytest.raises(StreamAborted):
        model.stream(request(), sink)
    assert sink.deltas == ["one"] and sink.restarts == []
    assert len(server.received) == 1
    assert model.stream(request(), RecordingSink()).text == "x"


# ---------------------------------------------------------------------------- encoding


def test_messages_are_encoded_natively(server: ProviderServer, make_model: ModelFactory) -> None:
    server.plan(Reply(frames=anthropic_message("done")))
    calls = (
        ToolCall(id="toolu_1", name="read_file", arguments='{"path": "a.txt"}'),
        ToolCall(id="toolu_2", name="read_file", arguments='{"path": "secret"}'),
    )
    make_model(max_tokens=777).stream(
        request(
            UserMessage(text="read both"),
            AssistantMessage(text="Reading.", tool_calls=calls),
            ToolMessage(call_id="toolu_1", name="read_file", content="A"),
            ToolMessage(call_id="toolu_2", name="read_file", content="denied", is_error=True),
            UserMessage(text="only the first", origin="steer"),
            AssistantMessage(text="", tool_calls=(calls[0],)),
            ToolMessage(call_id="toolu_1", name="read_file", content="A"),
        ),
        RecordingSink(),
    )
    body = server.received[0].json()
    assert (body["model"], body["max_tokens"], body["stream"]) == ("claude-test", 777, True)
    assert body["system"] == [{"type": "text", "text": "You are terse.", "cache_control": CACHE}]
    assert body["tools"] == [
        {
            "name": "read_file",
            "description": "Read a file.",
            "input_schema": {"properties": {"path": {"type": "string"}}, "type": "object"},
        }
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "read both"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "read_file",
                    "input": {"path": "a.txt"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "read_file",
                    "input": {"path": "secret"},
                },
            ],
        },
        # Tool results and the steer that followed are one user turn, results first.
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "A"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "denied",
                    "is_error": True,
                },
                {"type": "text", "text": "only the first"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "read_file",
                    "input": {"path": "a.txt"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "A",
                    "cache_control": CACHE,
                }
            ],
        },
    ]


def test_prompt_caching_can_be_turned_off_and_garbage_arguments_are_kept(
    server: ProviderServer, make_model: ModelFactory
) -> None:
    server.plan(Reply(frames=anthropic_message("ok")))
    bad = ToolCall(id="toolu_9", name="read_file", arguments="{not json")
    make_model(prompt_cache=False).stream(
        request(
            UserMessage(text="go"),
            AssistantMessage(text="", tool_calls=(bad,)),
            ToolMessage(call_id="toolu_9", name="read_file", content="bad JSON", is_error=True),
        ),
        RecordingSink(),
    )
    body = server.received[0].body
    assert b"cache_control" not in body
    messages = server.received[0].json()["messages"]
    assert messages[1]["content"][0]["input"] == {"_raw_arguments": "{not json"}


def test_equal_prefixes_are_byte_identical_on_the_wire(
    server: ProviderServer, make_model: ModelFactory
) -> None:
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
    server.plan(*(Reply(frames=anthropic_message("ok")) for _ in range(3)))
    model = make_model()
    model.stream(request(UserMessage(text="hi")), RecordingSink())
    model.stream(request(UserMessage(text="hi"), prefix=reordered), RecordingSink())
    longer = (UserMessage(text="hi"), AssistantMessage(text="ok"), UserMessage(text="more"))
    model.stream(request(*longer, prefix=reordered), RecordingSink())
    bodies = [r.body for r in server.received]
    assert bodies[0] == bodies[1]

    def prefix_bytes(body: bytes) -> bytes:
        # system and tools are the body's last fields; the messages come before them.
        return body[body.index(b'"system":') :]

    assert prefix_bytes(bodies[0]) == prefix_bytes(bodies[2])


# ---------------------------------------------------------------------------- credentials


def test_the_key_is_never_shown(server: ProviderServer, make_model: ModelFactory) -> None:
    server.plan(Reply(status=401, echo_key=True))
    model = make_model()
    assert KEY not in repr(model)
    with pytest.raises(ProviderError) as caught:
        model.stream(request(), RecordingSink())
    assert caught.value.status == 401
    assert KEY not in str(caught.value) and "[redacted]" in str(caught.value)
    assert caught.value.__context__ is None


def test_a_missing_key_is_refused_at_construction(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for variable in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))  # no profile on disk either
    with pytest.raises(InvalidRequest, match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-test", base_url="http://127.0.0.1:9")


# ---------------------------------------------------------------------------- a whole turn


def test_a_parley_turn_on_anthropic_calls_a_tool_replays_it_natively_and_records_usage(
    server: ProviderServer, make_model: ModelFactory, tmp_path: Path
) -> None:
    root = tmp_path / "work"
    root.mkdir()
    (root / "notes.txt").write_text("remember the milk\n")
    server.plan(
        Reply(
            frames=anthropic_message(
                "Reading. ",
                tool_uses=[("toolu_1", "read_file", ['{"pa', 'th": "notes.txt"}'])],
                usage=(30, 9, 12, 0),
            )
        ),
        Reply(frames=anthropic_message("It says: ", "remember the milk.", usage=(60, 6, 30, 0))),
    )
    host = parley.Host(model=Fallover([make_model()], backoff=Backoff(initial=0.01)))
    with parley.connect("sqlite:///" + str(tmp_path / "db.sqlite"), host=host) as client:
        session = client.open_session(root=str(root))
        events: list[Event] = []
        result = session.turn("what do my notes say?", on_event=events.append, timeout=30)
        steps = client.store.steps_of(result.turn_id)

    assert result.outcome == "finished", result
    assert result.reply == "It says: remember the milk."
    tokens = [e.data["text"] for e in events if e.kind is EventKind.TOKEN]
    assert tokens == ["Reading. ", "It says: ", "remember the milk."]
    (tool_result,) = [e.data for e in events if e.kind is EventKind.TOOL_RESULT]
    assert tool_result["content"] == "remember the milk\n" and not tool_result["is_error"]
    # Usage per step: Anthropic's cache reads count as input and are kept as cached.
    assert [s.payload.usage for s in steps] == [
        Usage(input_tokens=42, output_tokens=9, cached_tokens=12),
        Usage(input_tokens=90, output_tokens=6, cached_tokens=30),
    ]
    # The second request replays the tool round natively: tool_use, then its tool_result.
    second = server.received[1].json()
    assert second["messages"][-2]["content"][-1] == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "read_file",
        "input": {"path": "notes.txt"},
    }
    assert second["messages"][-1]["content"][0]["type"] == "tool_result"
    assert second["messages"][-1]["content"][0]["tool_use_id"] == "toolu_1"
