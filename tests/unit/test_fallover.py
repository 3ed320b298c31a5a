"""Fallover: retrying a cut stream on the same provider, then falling over to the next, with
the sink restarted before every new attempt.  Providers are real clients against loopback
servers; a few cases use small in-process models to pin down the control flow."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from parley.errors import InvalidRequest
from parley.models import (
    AnthropicModel,
    Backoff,
    CompletionModel,
    Fallover,
    FunctionModel,
    OpenAIChatModel,
    ProviderError,
    RateLimited,
)
from parley.ports.admission import Limits
from parley.ports.host import DeltaSink, ModelReply, ModelRequest, ModelThrottled, StreamAborted
from parley.schemas.messages import Prefix, UserMessage
from tests.providers.servers import (
    ProviderServer,
    Reply,
    anthropic_message,
    anthropic_server,
    openai_server,
    openai_text,
)
from tests.providers.sink import RecordingSink

OPENAI_KEY = "sk-test-123456"
ANTHROPIC_KEY = "sk-ant-123456"
FAST = Backoff(initial=0.01, maximum=0.02)
REQUEST = ModelRequest(
    prefix=Prefix(system_prompt="s", tools=()), messages=(UserMessage(text="hi"),)
)


@pytest.fixture
def oa_server() -> Iterator[ProviderServer]:
    with openai_server() as running:
        yield running


@pytest.fixture
def an_server() -> Iterator[ProviderServer]:
    with anthropic_server() as running:
        yield running


@pytest.fixture
def openai_model(oa_server: ProviderServer) -> Iterator[OpenAIChatModel]:
    model = OpenAIChatModel(
        "gpt-test",
        base_url=oa_server.base_url,
        api_key=OPENAI_KEY,
        timeout=2.0,
        max_retries=0,
    )
    yield model
    model.close()


@pytest.fixture
def anthropic_model(an_server: ProviderServer) -> Iterator[AnthropicModel]:
    model = AnthropicModel(
        "claude-test",
        base_url=an_server.base_url,
        api_key="sk-ant-123456",
        timeout=2.0,
        max_retries=0,
    )
    yield model
    model.close()


def test_a_cut_stream_is_retried_on_the_same_provider_after_a_restart(
    oa_server: ProviderServer, openai_model: OpenAIChatModel
) -> None:
    oa_server.plan(
        Reply(frames=openai_text("Partial ", "answ", "er"), cut_after=3),
        Reply(frames=openai_text("Whole ", "answer.")),
    )
    sink = RecordingSink()
    reply = Fallover([openai_model], backoff=FAST).stream(REQUEST, sink)
    assert reply.text == "Whole answer." and reply.model == "openai:gpt-test"
    assert sink.log == [
        ("delta", "Partial "),
        ("delta", "answ"),
        ("restart", "retry"),
        ("delta", "Whole "),
        ("delta", "answer."),
    ]
    assert sink.text == "Whole answer."


def test_a_malformed_chunk_is_retried(
    oa_server: ProviderServer, openai_model: OpenAIChatModel
) -> None:
    oa_server.plan(
        Reply(frames=[*openai_text("bad")[:2], b"data: {nope\n\n"]),
        Reply(frames=openai_text("good")),
    )
    sink = RecordingSink()
    assert Fallover([openai_model], backoff=FAST).stream(REQUEST, sink).text == "good"
    assert sink.restarts == ["retry"]


def test_after_its_retries_a_provider_falls_over_to_the_next(
    oa_server: ProviderServer,
    an_server: ProviderServer,
    openai_model: OpenAIChatModel,
    anthropic_model: AnthropicModel,
) -> None:
    cut = Reply(frames=openai_text("Hal", "f"), cut_after=2)
    oa_server.plan(cut, cut)
    an_server.plan(Reply(frames=anthropic_message("From ", "Claude.")))
    sink = RecordingSink()
    chain = Fallover([openai_model, anthropic_model], retries_per_model=1, backoff=FAST)
    reply = chain.stream(REQUEST, sink)
    assert reply.text == "From Claude."
    assert reply.model == "anthropic:claude-test"
    assert sink.restarts == ["retry", "fallover"]
    assert sink.text == "From Claude."
    assert len(oa_server.received) == 2 and len(an_server.received) == 1
    assert chain.name == "openai:gpt-test,anthropic:claude-test"


def test_a_rejected_request_falls_over_at_once(
    oa_server: ProviderServer,
    an_server: ProviderServer,
    anthropic_model: AnthropicModel,
) -> None:
    retrying_client = OpenAIChatModel(
        "gpt-test", base_url=oa_server.base_url, api_key=OPENAI_KEY, max_retries=2
    )
    oa_server.plan(Reply(status=401, body={"error": {"message": "invalid key"}}))
    an_server.plan(Reply(frames=anthropic_message("ok")))
    sink = RecordingSink()
    try:
        reply = Fallover([retrying_client, anthropic_model], backoff=FAST).stream(REQUEST, sink)
    finally:
        retrying_client.close()
    assert reply.model == "anthropic:claude-test"
    assert len(oa_server.received) == 1  # neither the client nor Fallover retried a 401
    assert sink.restarts == ["fallover"]


def test_a_provider_slower_than_its_timeout_falls_over(
    oa_server: ProviderServer, an_server: ProviderServer, anthropic_model: AnthropicModel
) -> None:
    slow = OpenAIChatModel(
        "gpt-test",
        base_url=oa_server.base_url,
        api_key=OPENAI_KEY,
        timeout=0.3,
        max_retries=0,
    )
    oa_server.plan(Reply(delay=3.0, frames=openai_text("late")))
    an_server.plan(Reply(frames=anthropic_message("on time")))
    started = time.monotonic()
    try:
        reply = Fallover([slow, anthropic_model], backoff=FAST).stream(REQUEST, RecordingSink())
    finally:
        slow.close()
    assert reply.text == "on time" and reply.model == "anthropic:claude-test"
    assert time.monotonic() - started < 2.0  # the timeout is per attempt, not waited out


def test_when_every_provider_fails_the_error_names_each_and_why(
    oa_server: ProviderServer,
    an_server: ProviderServer,
    openai_model: OpenAIChatModel,
    anthropic_model: AnthropicModel,
) -> None:
    cut = Reply(frames=openai_text("Hal", "f"), cut_after=2)
    oa_server.plan(cut, cut, cut)
    an_server.plan(
        Reply(
            status=404,
            body={"type": "error", "error": {"type": "not_found_error", "message": "no model"}},
        )
    )
    sink = RecordingSink()
    chain = Fallover([openai_model, anthropic_model], retries_per_model=2, backoff=FAST)
    with pytest.raises(ProviderError) as caught:
        chain.stream(REQUEST, sink)
    message = str(caught.value)
    assert message.startswith("every model provider failed: ")
    assert "openai:gpt-test (3 attempts): the stream was cut" in message
    assert "anthropic:claude-test (1 attempt): HTTP 404: no model" in message
    assert caught.value.provider == "openai:gpt-test,anthropic:claude-test"
    assert sink.restarts == ["retry", "retry", "fallover"]


# ---------------------------------------------------------------------------- rate limits


def rate_limited(retry_after: str, **headers: str) -> Reply:
    return Reply(
        status=429,
        headers={"retry-after": retry_after, **headers},
        body={"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
    )


@pytest.fixture
def retrying_models(
    oa_server: ProviderServer, an_server: ProviderServer
) -> Iterator[tuple[OpenAIChatModel, AnthropicModel]]:
    """Both providers with the clients' own retries on: a 429 must still reach each
    server once."""
    pair = (
        OpenAIChatModel("gpt-test", base_url=oa_server.base_url, api_key=OPENAI_KEY, max_retries=2),
        AnthropicModel(
            "claude-test", base_url=an_server.base_url, api_key=ANTHROPIC_KEY, max_retries=2
        ),
    )
    yield pair
    for model in pair:
        model.close()


def test_a_rate_limited_provider_falls_over_and_the_reply_keeps_its_own_limits(
    oa_server: ProviderServer,
    an_server: ProviderServer,
    retrying_models: tuple[OpenAIChatModel, AnthropicModel],
) -> None:
    oa_server.plan(rate_limited("30", **{"x-ratelimit-limit-requests": "500"}))
    an_server.plan(
        Reply(
            frames=anthropic_message("ok"),
            headers={"anthropic-ratelimit-requests-limit": "50"},
        )
    )
    sink = RecordingSink()
    started = time.monotonic()
    reply = Fallover(list(retrying_models), backoff=FAST).stream(REQUEST, sink)
    assert time.monotonic() - started < 5.0  # nobody waited out the 30 s
    assert (reply.model, reply.limits) == ("anthropic:claude-test", Limits(rpm=50))
    assert len(oa_server.received) == 1
    assert sink.restarts == ["fallover"]


def test_when_every_provider_failed_and_one_was_rate_limited_the_chain_is_rate_limited(
    oa_server: ProviderServer,
    an_server: ProviderServer,
    retrying_models: tuple[OpenAIChatModel, AnthropicModel],
) -> None:
    oa_server.plan(rate_limited("2"), rate_limited("2"))
    an_server.plan(
        rate_limited("5"),
        Reply(
            status=404,
            body={"type": "error", "error": {"type": "not_found_error", "message": "no model"}},
        ),
    )
    chain = Fallover(list(retrying_models), backoff=FAST)

    with pytest.raises(RateLimited) as both:
        chain.stream(REQUEST, RecordingSink())
    assert isinstance(both.value, ModelThrottled)
    assert both.value.retry_after == 5.0  # the longest: by then both have capacity
    assert both.value.limits is None  # two providers' limits are not the chain's
    assert both.value.provider == "openai:gpt-test,anthropic:claude-test"
    assert "openai:gpt-test (1 attempt): HTTP 429: slow down" in str(both.value)
    assert (len(oa_server.received), len(an_server.received)) == (1, 1)

    # One rate limited, the other refusing outright: waiting may still get an answer.
    with pytest.raises(RateLimited) as one:
        chain.stream(REQUEST, RecordingSink())
    assert one.value.retry_after == 2.0
    assert "HTTP 404: no model" in str(one.value)


def test_a_chain_of_one_reports_its_providers_limits_when_rate_limited(
    oa_server: ProviderServer, retrying_models: tuple[OpenAIChatModel, AnthropicModel]
) -> None:
    oa_server.plan(rate_limited("1", **{"x-ratelimit-limit-tokens": "40000"}))
    with pytest.raises(RateLimited) as caught:
        Fallover([retrying_models[0]], backoff=FAST).stream(REQUEST, RecordingSink())
    assert (caught.value.retry_after, caught.value.limits) == (1.0, Limits(tpm=40_000))
    assert len(oa_server.received) == 1  # neither the client nor Fallover retried it


def test_the_output_ceiling_of_a_chain_is_its_largest() -> None:
    class Capped(Failing):
        def __init__(self, name: str, ceiling: int | None) -> None:
            super().__init__(name)
            self.output_ceiling = ceiling

    assert Fallover([Capped("a", 300), Capped("b", None), Capped("c", 900)]).output_ceiling == 900
    assert Fallover([Capped("a", None), Failing("b")]).output_ceiling is None


# ---------------------------------------------------------------------------- control flow


class Failing:
    """A model that raises the given errors in turn, then answers."""

    def __init__(self, name: str, *errors: BaseException, text: str = "ok") -> None:
        self.name = name
        self.errors = list(errors)
        self.calls = 0
        self.text = text

    def stream(self, request: ModelRequest, on_delta: DeltaSink) -> ModelReply:
        self.calls += 1
        on_delta(f"attempt {self.calls} ")
        if self.errors:
            raise self.errors.pop(0)
        on_delta(self.text)
        return ModelReply(text=self.text)


def cut(name: str) -> ProviderError:
    return ProviderError(f"{name}: cut", provider=name, retriable=True, phase="stream")


def test_retries_back_off_with_jitter() -> None:
    sink = RecordingSink()
    pauses: dict[int, float] = {}  # restart number → seconds slept after it

    def sleep(seconds: float) -> None:
        assert seconds <= 0.1 + 1e-9  # in slices, so an interrupt gets through
        pauses[len(sink.restarts)] = pauses.get(len(sink.restarts), 0.0) + seconds

    model = Failing("m", cut("m"), cut("m"), cut("m"))
    backoff = Backoff(initial=1.0, multiplier=2.0, maximum=3.0, jitter=0.25)
    reply = Fallover([model], retries_per_model=3, backoff=backoff, sleep=sleep).stream(
        REQUEST, sink
    )
    assert reply.model == "m"  # filled in with the provider's name
    assert sorted(pauses) == [1, 2, 3]  # each pause comes after its restart
    for number, base in zip([1, 2, 3], [1.0, 2.0, 3.0], strict=True):
        assert base * 0.75 - 1e-9 <= pauses[number] <= base + 1e-9


def test_an_interrupt_during_a_backoff_pause_stops_at_once() -> None:
    sink = RecordingSink()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            sink.interrupted.set()  # the operator interrupts while Fallover waits

    model = Failing("m", cut("m"), cut("m"))
    backoff = Backoff(initial=5.0, jitter=0.0)
    with pytest.raises(StreamAborted):
        Fallover([model], retries_per_model=2, backoff=backoff, sleep=sleep).stream(REQUEST, sink)
    assert model.calls == 1  # no new paid request after the interrupt
    assert sum(slept) <= 0.31  # not the whole 5 s pause


def test_an_interrupt_is_never_retried_nor_fallen_over() -> None:
    first = Failing("first", StreamAborted())
    second = Failing("second")
    sink = RecordingSink()
    with pytest.raises(StreamAborted):
        Fallover([first, second], backoff=FAST).stream(REQUEST, sink)
    assert (first.calls, second.calls) == (1, 0)
    assert sink.restarts == []


def test_errors_that_are_not_provider_failures_propagate() -> None:
    first = Failing("first", RuntimeError("a bug"))
    second = Failing("second")
    with pytest.raises(RuntimeError, match="a bug"):
        Fallover([first, second], backoff=FAST).stream(REQUEST, RecordingSink())
    assert second.calls == 0


def test_a_reply_keeps_the_model_name_its_provider_gave() -> None:
    model = FunctionModel(lambda request: ModelReply(text="hi", model="exact-model-v2"))
    assert Fallover([model]).stream(REQUEST, RecordingSink()).model == "exact-model-v2"


def test_construction_is_checked() -> None:
    with pytest.raises(InvalidRequest):
        Fallover([])
    with pytest.raises(InvalidRequest):
        Fallover([Failing("m")], retries_per_model=-1)
    with pytest.raises(InvalidRequest):
        Backoff(jitter=2.0)


class FlakyCompletion(CompletionModel):
    """A provider without streaming: fails once (as if its response was cut), then
    answers in one piece."""

    def __init__(self) -> None:
        super().__init__(name="batch:model")
        self.calls = 0

    def complete(self, request: ModelRequest) -> ModelReply:
        self.calls += 1
        if self.calls == 1:
            raise cut(self.name)
        return ModelReply(text="all at once")


def test_a_completion_model_streams_its_answer_as_one_delta_and_can_be_retried() -> None:
    model = FlakyCompletion()
    sink = RecordingSink()
    reply = Fallover([model], backoff=FAST).stream(REQUEST, sink)
    assert (reply.text, reply.model) == ("all at once", "batch:model")
    assert sink.log == [("restart", "retry"), ("delta", "all at once")]
