"""A chat-completions batch's lines (src/parley/openai_api/chat_requests.py and
chat_messages.py): each is a turn in a session of its own, its system and developer
messages the instructions, its newest user message the prompt, the messages before it
the conversation the session starts with (checked as seed_history checks one), its
max_tokens or max_completion_tokens the turn's budget; a line parley cannot take as
asked is refused alone, naming the parameter; a line's url must be the batch's
endpoint."""

from __future__ import annotations

from typing import Any

import pytest

from parley.openai_api.batch_lines import ParsedLine, read_lines
from parley.schemas.batches import Endpoint, LineRefusal

CHAT = Endpoint.CHAT_COMPLETIONS
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


def parse_lines(
    lines: list[tuple[int, Any]], endpoint: Endpoint = Endpoint.RESPONSES
) -> tuple[list[ParsedLine], list[LineRefusal]]:
    """The lines read, split into those parsed and those refused."""
    parsed: list[ParsedLine] = []
    refused: list[LineRefusal] = []
    for line in read_lines(lines, endpoint):
        (parsed if isinstance(line, ParsedLine) else refused).append(line)  # type: ignore[arg-type]
    return parsed, refused


def chat_line(body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    return {**line, **extra}


def messages(*given: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": list(given)}


def refusal_of(body: Any) -> tuple[str, str | None, str]:
    parsed, refused = parse_lines([(1, chat_line(body))], CHAT)
    assert parsed == [] and len(refused) == 1, (parsed, refused)
    return refused[0].code, refused[0].param, refused[0].message


def test_a_line_in_openais_documented_shape_is_a_prompt_in_a_session_of_its_own() -> None:
    body = {
        "model": "gpt-3.5-turbo-0125",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello world!"},
        ],
        "max_tokens": 1000,
    }
    [line], refused = parse_lines([(4, chat_line(body))], CHAT)

    assert refused == []
    assert (line.line, line.custom_id, line.prompt) == (4, "a", "Hello world!")
    assert line.contract is not None and line.contract.max_tokens == 1000
    # Chat completions are stateless: every line opens a session, with nothing before.
    assert line.previous_response_id is None and line.conversation is None
    assert line.history is None and line.metadata == {}


def test_the_messages_before_the_prompt_are_the_conversation_its_session_starts_with() -> None:
    given: list[dict[str, Any]] = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": "look it up", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "found: 42"},
        {"role": "assistant", "content": [{"type": "text", "text": "It is 42."}]},
        {"role": "system", "content": "Answer in French."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "and"}, {"type": "text", "text": "?"}],
        },
    ]
    body = {**messages(*given), "max_completion_tokens": 300, "metadata": {"job": "7"}}
    [line], refused = parse_lines([(1, chat_line(body))], CHAT)

    assert refused == [] and line.prompt == "and\n?"
    assert line.contract is not None and line.contract.max_tokens == 300
    assert line.metadata == {"job": "7"}
    assert line.history is not None
    [(prompt, steps)] = line.history.turns
    assert prompt == "look it up"
    assert [(s.text, [c.id for c in s.tool_calls]) for s in steps] == [
        ("", ["call_1"]),
        ("It is 42.", []),
    ]
    assert steps[0].tool_results[0].content == "found: 42"
    # The messages as given, kept beside them (Session.seeded): the instructions are not
    # part of the conversation.
    assert list(line.history.messages) == given[1:5]


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ("hello", "invalid_request", "body"),
        ({"model": "m"}, "invalid_body", "body.messages"),
        ({**messages({"role": "user", "content": "x"}), "nope": 1}, "invalid_body", "body.nope"),
        ({**messages({"role": "user", "content": "x"}), "n": "2"}, "invalid_body", "body.n"),
        (
            messages({"role": "system", "content": "only instructions"}),
            "invalid_request",
            "body.messages",
        ),
        (messages({"role": "user", "content": "   "}), "empty", "body.messages[0].content"),
        (messages("not a message"), "invalid_request", "body.messages[0]"),
        (messages({"role": "critic", "content": "x"}), "invalid_request", "body.messages[0].role"),
        (messages({"role": ["user"], "content": "x"}), "invalid_request", "body.messages[0].role"),
        (
            messages({"role": "function", "name": "f", "content": "x"}),
            "invalid_request",
            "body.messages[0].role",
        ),
        (
            messages({"role": "user", "content": "x", "x": 1}),
            "invalid_request",
            "body.messages[0].x",
        ),
        (
            messages(
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
                }
            ),
            "invalid_request",
            "body.messages[0].content[0]",
        ),
        (
            messages({"role": "user", "content": "x"}, {"role": "assistant", "content": "prefill"}),
            "invalid_request",
            "body.messages[1]",
        ),
        (
            messages({"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "x"}),
            "invalid_request",
            "body.messages[0]",
        ),
        (
            messages(
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": None},
                {"role": "user", "content": "y"},
            ),
            "invalid_request",
            "body.messages[1].content",
        ),
        (
            messages(
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom"}]},
                {"role": "user", "content": "y"},
            ),
            "invalid_request",
            "body.messages[1].tool_calls[0]",
        ),
        (
            messages(
                {"role": "user", "content": "x"},
                {"role": "tool", "content": "orphan"},
                {"role": "user", "content": "y"},
            ),
            "invalid_request",
            "body.messages[1].tool_call_id",
        ),
        (
            {**messages({"role": "user", "content": "x"}), "tools": [{"type": "function"}]},
            "invalid_request",
            "body.tools",
        ),
        (
            {**messages({"role": "user", "content": "x"}), "functions": [{"name": "f"}]},
            "invalid_request",
            "body.functions",
        ),
        ({**messages({"role": "user", "content": "x"}), "n": 2}, "invalid_request", "body.n"),
        (
            {**messages({"role": "user", "content": "x"}), "stream": True},
            "invalid_request",
            "body.stream",
        ),
        (
            {
                **messages({"role": "user", "content": "x"}),
                "response_format": {"type": "json_object"},
            },
            "invalid_request",
            "body.response_format",
        ),
        (
            {**messages({"role": "user", "content": "x"}), "modalities": ["text", "audio"]},
            "invalid_request",
            "body.modalities",
        ),
        (
            {
                **messages({"role": "user", "content": "x"}),
                "max_tokens": 5,
                "max_completion_tokens": 5,
            },
            "invalid_request",
            "body.max_tokens",
        ),
        (
            {**messages({"role": "user", "content": "x"}), "max_tokens": 0},
            "invalid_body",
            "body.max_tokens",
        ),
        (
            {**messages({"role": "user", "content": "x"}), "metadata": {"k": float("nan")}},
            "invalid_request",
            "body.metadata",
        ),
    ],
)
def test_a_line_parley_cannot_take_as_asked_is_refused_alone_naming_the_parameter(
    body: Any, code: str, param: str
) -> None:
    found_code, found_param, message = refusal_of(body)
    assert (found_code, found_param) == (code, param) and message
    good = chat_line(messages({"role": "user", "content": "fine"}), custom_id="b")
    parsed, refused = parse_lines([(1, chat_line(body)), (2, good)], CHAT)
    assert [p.custom_id for p in parsed] == ["b"] and [r.line for r in refused] == [1]


def test_an_imported_tool_call_without_its_result_is_refused_alone() -> None:
    body = messages(
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "user", "content": "well?"},
    )
    code, param, message = refusal_of(body)
    assert (code, param) == ("invalid_messages", "body.messages")
    assert "call_1" in message and "no result" in message
    answered_twice = messages(
        {"role": "user", "content": "x"},
        {"role": "tool", "tool_call_id": "call_9", "content": "for no call"},
        {"role": "user", "content": "y"},
    )
    assert refusal_of(answered_twice)[:2] == ("invalid_messages", "body.messages")


def test_parameters_parley_cannot_honour_are_accepted_without_effect() -> None:
    body = {
        **messages({"role": "user", "content": "hi"}),
        "temperature": 0,
        "top_p": 0.5,
        "seed": 7,
        "stop": ["\n"],
        "logprobs": True,
        "top_logprobs": 2,
        "logit_bias": {"50256": -100},
        "frequency_penalty": 0.1,
        "presence_penalty": 0.1,
        "store": False,
        "n": 1,
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "reasoning_effort": "low",
        "verbosity": "low",
        "service_tier": "flex",
        "user": "u-1",
        "response_format": {"type": "text"},
        "modalities": ["text"],
        "prompt_cache_key": "k",
        "stream": False,
    }
    [line], refused = parse_lines([(1, chat_line(body))], CHAT)
    assert refused == [] and line.prompt == "hi" and line.contract is None


def test_a_lines_url_must_be_its_batchs_endpoint() -> None:
    chat = chat_line(messages({"role": "user", "content": "x"}))
    responses = {**chat, "url": "/v1/responses", "body": {"input": "x"}, "custom_id": "r"}
    parsed, refused = parse_lines([(1, chat), (2, responses)], CHAT)
    assert [p.custom_id for p in parsed] == ["a"]
    assert [(r.custom_id, r.code, r.param) for r in refused] == [("r", "invalid_url", "url")]
    assert "/v1/chat/completions" in refused[0].message
    parsed, refused = parse_lines([(1, chat), (2, responses)])  # a batch of Responses
    assert [p.custom_id for p in parsed] == ["r"]
    assert [(r.custom_id, r.code) for r in refused] == [("a", "invalid_url")]
