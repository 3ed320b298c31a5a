"""Compaction strategies keep tool rounds whole (docs/compaction.md#strategies): whatever
the conversation, what a strategy makes never holds a call without its result, and
``trim`` keeps every call, every result and every prompt in place; which compaction
applies to a path (docs/compaction.md#which-one-applies); the stored form of messages."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.engine.compaction import (
    SUMMARY_HEADINGS,
    SUMMARY_INSTRUCTIONS,
    message_tokens,
    summary_message,
    transcript_text,
    trim,
    trimmed_result_marker,
)
from parley.engine.context import check_replay
from parley.errors import CodecError
from parley.schemas.compactions import (
    CompactionRecord,
    CompactionStrategy,
    applicable,
    messages_from_json,
    messages_to_json,
)
from parley.schemas.messages import AssistantMessage, Message, ToolCall, ToolMessage, UserMessage

texts = st.text(max_size=300)


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Complete conversations: prompts, steers, the model's text, and rounds of one or
    more calls each answered (in any order) by its result."""
    messages: list[Message] = []
    calls = 0
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["prompt", "steer", "text", "round"]))
        if kind in ("prompt", "steer"):
            text = draw(texts)
            message = (
                UserMessage(text=text)
                if kind == "prompt"
                else UserMessage(text=text, origin="steer")
            )
            messages.append(message)
        elif kind == "text":
            messages.append(AssistantMessage(text=draw(texts)))
        else:
            round_calls = []
            for _ in range(draw(st.integers(1, 3))):
                calls += 1
                arguments = json.dumps({"body": draw(texts)})
                round_calls.append(ToolCall(id=f"c{calls}", name="t", arguments=arguments))
            messages.append(AssistantMessage(text=draw(texts), tool_calls=tuple(round_calls)))
            for call in draw(st.permutations(round_calls)):
                messages.append(ToolMessage(call_id=call.id, name=call.name, content=draw(texts)))
    return messages


def answered(messages: tuple[Message, ...]) -> dict[str, str]:
    """Each call's id → the id of the result answering it (both must be there)."""
    calls = [c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    results = [m.call_id for m in messages if isinstance(m, ToolMessage)]
    assert sorted(calls) == sorted(results)
    return {c: c for c in calls}


@settings(max_examples=300, deadline=None)
@given(conversations(), st.integers(0, 5))
def test_trim_keeps_every_round_whole(messages: list[Message], keep: int) -> None:
    made, replaced = trim(messages, keep=keep)
    check_replay(made)  # no call without its result, no result without its call
    assert answered(made) == answered(tuple(messages))
    assert len(made) == len(messages)
    assert message_tokens(made) <= message_tokens(messages)
    for before, after in zip(messages, made, strict=True):
        assert type(before) is type(after)
        if isinstance(before, UserMessage):
            assert after == before
        if isinstance(before, AssistantMessage):
            assert isinstance(after, AssistantMessage)
            assert after.text == before.text
            assert [c.id for c in after.tool_calls] == [c.id for c in before.tool_calls]
            for call in after.tool_calls:
                json.loads(call.arguments)  # still a JSON object a provider can parse
    rounds = [m for m in messages if isinstance(m, AssistantMessage) and m.tool_calls]
    kept = rounds[len(rounds) - keep :] if keep else []
    for message in kept:
        assert message in made  # the newest ``keep`` rounds are untouched
    assert replaced <= sum(len(m.tool_calls) for m in rounds) * 2


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_a_summary_leaves_no_round_to_break(messages: list[Message]) -> None:
    made = (summary_message("## Goal\nx"),)
    check_replay(made)
    text = transcript_text(messages)
    assert text.count("CALLS") == sum(
        len(m.tool_calls) for m in messages if isinstance(m, AssistantMessage)
    )


def test_trim_replaces_only_what_its_marker_shortens() -> None:
    big = "x" * 500
    messages: list[Message] = [
        UserMessage(text="go"),
        AssistantMessage(text="", tool_calls=(ToolCall(id="a", name="t", arguments="{}"),)),
        ToolMessage(call_id="a", name="t", content=big),
        AssistantMessage(text="", tool_calls=(ToolCall(id="b", name="t", arguments="{}"),)),
        ToolMessage(call_id="b", name="t", content="short"),
    ]
    made, replaced = trim(messages, keep=0)
    assert replaced == 1
    assert made[2] == ToolMessage(call_id="a", name="t", content=trimmed_result_marker(500))
    assert made[4] == messages[4]


def test_trim_refuses_a_broken_conversation() -> None:
    call = ToolCall(id="a", name="t", arguments="{}")
    with pytest.raises(CodecError):
        trim([AssistantMessage(text="", tool_calls=(call,)), UserMessage(text="x")], keep=0)


def test_the_summary_is_asked_for_under_the_five_headings() -> None:
    for heading in SUMMARY_HEADINGS:
        assert f"## {heading}" in SUMMARY_INSTRUCTIONS


def record(through: str, minutes: int, *, dropped: bool = False) -> CompactionRecord:
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minutes)
    return CompactionRecord(
        compaction_id=f"{through}-{minutes}",
        session_id="s",
        through_turn_id=through,
        strategy=CompactionStrategy.TRIM,
        text="",
        messages=(),
        tokens_before=0,
        tokens_after=0,
        created_at=at,
        dropped_at=at if dropped else None,
    )


def test_the_compaction_reaching_furthest_along_the_path_applies() -> None:
    path = ["t1", "t2", "t3", "t4"]
    older, furthest, newest_same = record("t2", 1), record("t3", 2), record("t3", 3)
    assert applicable([older, furthest], path) == furthest
    assert applicable([older, furthest, newest_same], path) == newest_same
    assert applicable([older, record("t3", 3, dropped=True)], path) == older
    assert applicable([record("elsewhere", 9), older], path) == older  # another branch's
    assert applicable([record("t2", 1, dropped=True)], path) is None
    assert applicable([older], []) is None


def test_messages_keep_their_stored_form() -> None:
    messages = (
        UserMessage(text="a", origin="steer"),
        AssistantMessage(text="b", tool_calls=(ToolCall(id="c", name="t", arguments="{}"),)),
        ToolMessage(call_id="c", name="t", content="d", is_error=True),
    )
    assert messages_from_json(messages_to_json(messages)) == messages
    with pytest.raises(CodecError):
        messages_from_json([{"role": "system", "text": "x"}])
    with pytest.raises(CodecError):
        messages_from_json([{"role": "tool"}])
