"""The rate-limited provider server the admission tests run against, checked with the real
``openai`` client: its buckets refuse past the limit with OpenAI's body and headers and
refill, tokens count the prompt and ``max_tokens``, the quota mode, refusals out of phase,
tool steps, the stats, the throughput a fleet test needs, and the server as its own
process."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, cast

import openai
import pytest

from parley.models import OpenAIChatModel
from parley.models.errors import RateLimited
from parley.ports.admission import Limits
from parley.ports.host import ModelRequest
from parley.schemas.messages import Prefix, UserMessage
from tests.providers.account import ProviderAccount
from tests.providers.rate_limited_server import RateLimitedServer, go_duration, server_process
from tests.providers.sink import RecordingSink

HI: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture
def clients() -> Iterator[list[openai.OpenAI]]:
    made: list[openai.OpenAI] = []
    yield made
    for client in made:
        client.close()


def client_of(server: Any, made: list[openai.OpenAI]) -> openai.OpenAI:
    client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
    made.append(client)
    return client


def streamed_text(client: openai.OpenAI, messages: Any = HI, **options: Any) -> str:
    stream = client.chat.completions.create(
        model="gpt-test",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        **options,
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_the_requests_bucket_refuses_past_the_limit_with_openais_headers_and_refills(
    clients: list[openai.OpenAI],
) -> None:
    # 120 a minute, one second of burst: two calls at once, then one every half second.
    with RateLimitedServer(rpm=120, stream_seconds=0.05, chunks=2) as server:
        client = client_of(server, clients)
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-test", messages=HI, stream=True
        )
        assert raw.headers["x-ratelimit-limit-requests"] == "120"
        assert raw.headers["x-ratelimit-remaining-requests"] == "1"
        assert raw.headers["x-ratelimit-reset-requests"].endswith("ms")
        assert "x-ratelimit-limit-tokens" not in raw.headers  # no tokens limit set
        raw.parse().close()
        assert streamed_text(client) == "word0 word1 "

        with pytest.raises(openai.RateLimitError) as caught:
            streamed_text(client)
        refused = caught.value
        assert refused.status_code == 429
        assert refused.code == "rate_limit_exceeded" and refused.type == "requests"
        assert "Rate limit reached for requests" in refused.message
        headers = refused.response.headers
        assert headers["retry-after"] == "1"
        wait_ms = int(headers["retry-after-ms"])
        assert 0 < wait_ms <= 500
        assert headers["x-ratelimit-remaining-requests"] == "0"

        time.sleep(wait_ms / 1000 + 0.02)  # refilled continuously: no whole minute
        assert streamed_text(client) == "word0 word1 "
        stats = server.stats()
        assert (stats.admitted, stats.rate_limited, stats.quota_refused) == (3, 1, 0)
        assert len(stats.admitted_at) == 3 and sum(stats.per_second.values()) == 3


def test_tokens_count_the_prompt_estimate_and_max_tokens(clients: list[openai.OpenAI]) -> None:
    # 6,000 a minute: a bucket of 100 tokens, refilled at 100 a second.
    with RateLimitedServer(rpm=None, tpm=6000, stream_seconds=0.0, chunks=1) as server:
        client = client_of(server, clients)
        streamed_text(client, max_tokens=60)  # "hi" is 1 token: 61 taken
        with pytest.raises(openai.RateLimitError) as caught:
            streamed_text(client, max_completion_tokens=60)
        assert caught.value.type == "tokens"
        assert caught.value.response.headers["x-ratelimit-limit-tokens"] == "6000"
        assert int(caught.value.response.headers["x-ratelimit-remaining-tokens"]) < 60
        assert "x-ratelimit-limit-requests" not in caught.value.response.headers

        time.sleep(0.7)
        # No max_tokens: only the prompt counts (80 characters: 20 tokens).
        streamed_text(client, messages=[{"role": "user", "content": "x" * 80}])
        stream = client.chat.completions.create(
            model="gpt-test",
            messages=cast(Any, [{"role": "user", "content": "x" * 80}]),
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [c.usage for c in stream if c.usage is not None]
        assert usage[0].prompt_tokens == 20 and usage[0].completion_tokens == 1

        with pytest.raises(openai.RateLimitError) as too_large:
            streamed_text(client, max_tokens=7000)
        assert "Request too large" in too_large.value.message
        assert "retry-after" not in too_large.value.response.headers


def test_quota_mode_refuses_every_call_until_switched_off(clients: list[openai.OpenAI]) -> None:
    with RateLimitedServer(rpm=6000, stream_seconds=0.0) as server:
        client = client_of(server, clients)
        server.set_mode("quota")
        for _ in range(3):
            with pytest.raises(openai.RateLimitError) as caught:
                streamed_text(client)
            assert caught.value.code == "insufficient_quota"
            assert caught.value.type == "insufficient_quota"
            assert "You exceeded your current quota" in caught.value.message
            assert "retry-after" not in caught.value.response.headers
            assert caught.value.response.headers["x-ratelimit-limit-requests"] == "6000"
        server.set_mode("normal")
        assert streamed_text(client)
        stats = server.stats()
        assert (stats.admitted, stats.quota_refused, stats.refused) == (1, 3, 3)
        with pytest.raises(ValueError, match="mode must be one of"):
            server.set_mode("broke")


def test_refuse_refuses_the_next_calls_for_their_rate_whatever_the_buckets_hold(
    clients: list[openai.OpenAI],
) -> None:
    with RateLimitedServer(rpm=6000, stream_seconds=0.0) as server:
        client = client_of(server, clients)
        server.refuse(2)
        for _ in range(2):
            with pytest.raises(openai.RateLimitError) as caught:
                streamed_text(client)
            assert caught.value.code == "rate_limit_exceeded"
            assert caught.value.response.headers["retry-after-ms"] == "10"  # a request's time
        assert streamed_text(client)
        stats = server.stats()
        assert (stats.admitted, stats.rate_limited) == (1, 2)
        for bad in (-1, 1.5, True):
            with pytest.raises(ValueError, match="calls must be"):
                server.refuse(bad)  # type: ignore[arg-type]


def test_parleys_model_reads_its_limits_and_429s(clients: list[openai.OpenAI]) -> None:
    with RateLimitedServer(rpm=60, tpm=60_000, stream_seconds=0.0) as server:
        model = OpenAIChatModel("gpt-test", base_url=server.base_url, api_key="sk-test")
        request = ModelRequest(
            prefix=Prefix(system_prompt="", tools=()), messages=(UserMessage(text="hi"),)
        )
        try:
            reply = model.stream(request, RecordingSink())
            assert reply.limits == Limits(rpm=60, tpm=60_000)
            assert reply.usage.output_tokens == 10
            with pytest.raises(RateLimited) as caught:
                model.stream(request, RecordingSink())
        finally:
            model.close()
        assert caught.value.limits == Limits(rpm=60, tpm=60_000)
        assert caught.value.retry_after is not None and 0 < caught.value.retry_after <= 1.0
        assert server.stats().rate_limited == 1  # the client did not retry it


def test_a_user_asking_for_a_tool_gets_one_call_then_text(clients: list[openai.OpenAI]) -> None:
    with RateLimitedServer(rpm=6000, stream_seconds=0.0) as server:
        client = client_of(server, clients)
        asking: Any = [{"role": "user", "content": "please use tool read_file now"}]
        stream = client.chat.completions.create(model="gpt-test", messages=asking, stream=True)
        chunks = list(stream)
        calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
        assert [(t.id, t.function.name if t.function else None) for t in calls] == [
            ("call_read_file", "read_file")
        ]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        answered: Any = [
            *asking,
            {"role": "assistant", "content": None, "tool_calls": [_call("read_file")]},
            {"role": "tool", "tool_call_id": "call_read_file", "content": "contents"},
        ]
        assert streamed_text(client, messages=answered).startswith("word0")
        whole = client.chat.completions.create(model="gpt-test", messages=asking)
        assert whole.choices[0].finish_reason == "tool_calls"
        assert whole.usage is not None and whole.usage.prompt_tokens == 8


def _call(name: str) -> dict[str, Any]:
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_a_non_streamed_call_is_answered_whole(clients: list[openai.OpenAI]) -> None:
    with RateLimitedServer(rpm=6000, stream_seconds=0.1, chunks=3) as server:
        started = time.monotonic()
        answer = client_of(server, clients).chat.completions.create(model="gpt-test", messages=HI)
        assert time.monotonic() - started >= 0.1
        assert answer.choices[0].message.content == "word0 word1 word2 "
        assert answer.usage is not None and answer.usage.completion_tokens == 3


def test_a_hundred_concurrent_streams_run_side_by_side(clients: list[openai.OpenAI]) -> None:
    with RateLimitedServer(rpm=60_000, stream_seconds=1.0) as server:
        client = client_of(server, clients)
        texts: list[str] = []
        threads = [
            threading.Thread(target=lambda: texts.append(streamed_text(client))) for _ in range(100)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        elapsed = time.monotonic() - started
        stats = server.stats()
    assert len(texts) == 100 and all(text.startswith("word0") for text in texts)
    assert stats.admitted == 100 and stats.max_concurrent == 100
    assert elapsed < 4.0, elapsed  # a second of streaming each, not queued behind another


def test_the_server_runs_as_its_own_process(clients: list[openai.OpenAI]) -> None:
    with server_process("--rpm", "60", "--stream-seconds", "0", "--port", "0") as server:
        client = client_of(server, clients)
        assert streamed_text(client)
        with pytest.raises(openai.RateLimitError):
            streamed_text(client)
        stats = server.stats()
        assert (stats.admitted, stats.rate_limited) == (1, 1)
        server.set_mode("quota")
        with pytest.raises(openai.RateLimitError) as caught:
            streamed_text(client)
        assert caught.value.code == "insufficient_quota"
        server.set_mode("normal")
        server.reset_stats()
        server.refuse(1)
        with pytest.raises(openai.RateLimitError) as refused:
            streamed_text(client)
        assert refused.value.code == "rate_limit_exceeded"
        assert server.stats().rate_limited == 1
        server.reset_stats()
        assert server.stats().refused == 0
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(
                urllib.request.Request(
                    server.base_url.removesuffix("/v1") + "/mode", data=b'{"mode": "x"}'
                ),
                timeout=10,
            )
        assert bad.value.code == 400
        bad.value.close()


def test_bad_requests_and_settings_get_clear_errors(clients: list[openai.OpenAI]) -> None:
    with RateLimitedServer(rpm=6000) as server:
        request = urllib.request.Request(f"{server.base_url}/chat/completions", data=b"{not json")
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        assert caught.value.code == 400 and b"not JSON" in caught.value.read()
        caught.value.close()
        with pytest.raises(openai.BadRequestError, match="non-empty array"):
            client_of(server, clients).chat.completions.create(model="gpt-test", messages=[])
    for rpm, tpm, burst in ((0, None, 1.0), (None, -1, 1.0), (1, None, 0.0)):
        with pytest.raises(ValueError, match="must be a positive"):
            ProviderAccount(rpm=rpm, tpm=tpm, burst=burst)
    with pytest.raises(ValueError, match="chunks"):
        RateLimitedServer(chunks=0)


def test_durations_are_written_as_openai_writes_them() -> None:
    assert [go_duration(s) for s in (0.02, 0.0004, 1.0, 1.5, 59.9994, 360.0, 3600.0)] == [
        "20ms",
        "1ms",
        "1s",
        "1.5s",
        "59.999s",
        "6m0s",
        "1h0m0s",
    ]
