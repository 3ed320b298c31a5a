"""parley.transcript: the rows of a turn, their projections and their JSON form."""

from __future__ import annotations

import pytest

from parley import transcript
from parley.errors import CodecError
from parley.ports.backend import CommittedStep
from parley.schemas.messages import AssistantMessage, StepInput, StepPayload, ToolCall, ToolResult

CALL = ToolCall(id="c1", name="read_file", arguments='{"path": "a"}')
STEPS = [
    CommittedStep(
        index=0,
        payload=StepPayload(
            text="Looking.",
            tool_calls=(CALL,),
            tool_results=(ToolResult(call_id="c1", name="read_file", content="A"),),
        ),
    ),
    CommittedStep(
        index=1,
        payload=StepPayload(inputs=(StepInput(origin="steer", text="only a"),), text="A it is."),
    ),
]


def test_a_turns_rows_come_in_conversation_order() -> None:
    rows = transcript.rows("t1", "what is in a?", STEPS, partial="A it is, and")
    assert [r.kind for r in rows] == [
        "prompt",
        "assistant",
        "tool_result",
        "input",
        "assistant",
        "partial",
    ]
    native = transcript.to_messages(rows)
    assert [m.role for m in native] == ["user", "assistant", "tool", "user", "assistant"]
    assert isinstance(native[1], AssistantMessage) and native[1].tool_calls == (CALL,)
    lines = transcript.display(rows)
    assert lines[-1].partial and lines[-1].text == "A it is, and"
    assert not any(line.partial for line in lines[:-1])


def test_an_incomplete_tool_round_does_not_replay() -> None:
    rows = transcript.rows("t1", "what is in a?", STEPS)
    without_result = [r for r in rows if r.kind != "tool_result"]
    with pytest.raises(CodecError):
        transcript.to_messages(without_result)
    assert len(transcript.native(without_result)) == len(rows) - 1  # unchecked: as stored


def test_rows_round_trip_through_json_and_refuse_what_is_not_a_row() -> None:
    rows = transcript.rows("t1", "what is in a?", STEPS, partial="x", seeded=True)
    assert [transcript.from_json(transcript.to_json(r)) for r in rows] == rows
    for bad in ({"kind": "robot"}, {"kind": "prompt"}, {"text": "no kind"}):
        with pytest.raises(CodecError):
            transcript.from_json(bad)
