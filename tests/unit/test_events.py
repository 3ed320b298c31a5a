"""Every event kind has a declared payload: built through it, read through it, its wire
form unchanged, and old stored forms still loadable."""

from __future__ import annotations

from typing import Any

import pytest

from parley.schemas.errors import CodecError
from parley.schemas.events import (
    PAYLOADS,
    AgentEnded,
    AgentStarted,
    ApprovalAnswered,
    ApprovalRequested,
    Checked,
    Compacted,
    Ended,
    Event,
    EventKind,
    Queued,
    Refused,
    Started,
    Steered,
    StepCommitted,
    StepRestarted,
    Throttled,
    Token,
    ToolAnswered,
    ToolCalled,
    WaitingForEvent,
    payload_adapter,
)
from parley.schemas.messages import ToolCall
from parley.schemas.records import Usage

EXAMPLES: list[tuple[Any, dict[str, Any]]] = [
    (Queued(run_id="r"), {"run_id": "r"}),
    (Queued(run_id="r", resume=True), {"run_id": "r", "resume": True}),
    (
        Started(run_id="r", attempt=2, worker="h:1:t"),
        {"run_id": "r", "attempt": 2, "worker": "h:1:t"},
    ),
    (Token(step=0, text="hi"), {"step": 0, "text": "hi"}),
    (
        ToolCalled(step=1, call_id="c", name="read_file", arguments='{"path": "a"}'),
        {"step": 1, "call_id": "c", "name": "read_file", "arguments": '{"path": "a"}'},
    ),
    (
        ToolAnswered(
            step=1, call_id="c", name="read_file", content="x", is_error=True, refusal="deny_read"
        ),
        {
            "step": 1,
            "call_id": "c",
            "name": "read_file",
            "content": "x",
            "is_error": True,
            "refusal": "deny_read",
        },
    ),
    (
        Refused(call_id="c", tool="write_file", rule="deny_write", reason="secrets/**"),
        {"call_id": "c", "tool": "write_file", "rule": "deny_write", "reason": "secrets/**"},
    ),
    (
        Steered(position=3, text="only docs", step=2),
        {"position": 3, "text": "only docs", "step": 2},
    ),
    (
        Checked(passed=False, exit_code=None, output="timed out"),
        {"passed": False, "exit_code": None, "output": "timed out"},
    ),
    (
        StepCommitted(
            step=2,
            text="ok",
            tool_calls=(ToolCall(id="c", name="list_files", arguments="{}"),),
            usage=Usage(input_tokens=3, output_tokens=2),
        ),
        {
            "index": 2,
            "text": "ok",
            "tool_calls": [{"id": "c", "name": "list_files", "arguments": "{}"}],
            "usage": {"input_tokens": 3, "output_tokens": 2, "cached_tokens": 0},
        },
    ),
    (StepRestarted(step=1, reason="resumed"), {"index": 1, "reason": "resumed"}),
    (
        ApprovalRequested(
            approval_id="a",
            step=1,
            call_id="c",
            tool="run_command",
            arguments={"argv": ["git", "push"]},
            accesses=({"mode": "execute", "path": "git push"},),
            rule="ask_execute:git push *",
        ),
        {
            "approval_id": "a",
            "step": 1,
            "call_id": "c",
            "tool": "run_command",
            "arguments": {"argv": ["git", "push"]},
            "accesses": [{"mode": "execute", "path": "git push"}],
            "rule": "ask_execute:git push *",
            "expires_at": None,
        },
    ),
    (
        ApprovalAnswered(approval_id="a", decision="denied", reason="not today"),
        {"approval_id": "a", "decision": "denied", "reason": "not today"},
    ),
    (
        Throttled(model="openai:gpt-4o-mini", seconds=4.5, reason="requests"),
        {"model": "openai:gpt-4o-mini", "seconds": 4.5, "reason": "requests"},
    ),
    (
        WaitingForEvent(
            step=1, call_id="call_1_0", event="finance.approved", until="2027-01-04T08:00:00+00:00"
        ),
        {
            "index": 1,
            "call_id": "call_1_0",
            "event": "finance.approved",
            "until": "2027-01-04T08:00:00+00:00",
        },
    ),
    (
        Compacted(
            compaction_id="k",
            through_turn_id="t",
            strategy="trim",
            text="trimmed 2 tool results",
            tokens_before=900,
            tokens_after=300,
        ),
        {
            "compaction_id": "k",
            "through_turn_id": "t",
            "strategy": "trim",
            "text": "trimmed 2 tool results",
            "tokens_before": 900,
            "tokens_after": 300,
        },
    ),
    (
        AgentStarted(call_id="c1", agent="writer/critic", turn_id="t2", session_id="s2"),
        {"call_id": "c1", "agent": "writer/critic", "turn_id": "t2", "session_id": "s2"},
    ),
    (
        AgentEnded(call_id="c1", outcome="cancelled", agent="writer", turn_id="t2"),
        {"call_id": "c1", "outcome": "cancelled", "agent": "writer", "turn_id": "t2"},
    ),
    (
        Ended(outcome="cancelled", undelivered=("late",)),
        {"outcome": "cancelled", "reply": None, "error": None, "undelivered": ["late"]},
    ),
]


def test_every_kind_has_a_payload_and_an_example() -> None:
    assert set(PAYLOADS) == set(EventKind)
    assert {type(p).KIND for p, _wire in EXAMPLES} == set(EventKind)


@pytest.mark.parametrize(("payload", "wire"), EXAMPLES)
def test_a_payload_has_the_wire_form_of_the_spec_and_comes_back_whole(
    payload: Any, wire: dict[str, Any]
) -> None:
    event = Event.of("turn", 7, payload)
    assert event.kind is type(payload).KIND and event.data == wire
    again = Event.from_json(event.to_json())
    assert again == event and again.payload == payload


def test_old_stored_forms_load_with_defaults_and_keys_a_newer_writer_added_are_ignored() -> None:
    step = Event(turn_id="t", seq=3, kind=EventKind.STEP, data={"index": 0, "text": "a"})
    assert step.payload == StepCommitted(step=0, text="a")  # no calls, no usage stored
    end = Event(turn_id="t", seq=4, kind=EventKind.END, data={"outcome": "finished", "later": 1})
    assert end.payload == Ended(outcome="finished")
    steer = Event(turn_id="t", seq=2, kind=EventKind.STEER, data={"position": 1, "text": "a"})
    assert steer.payload == Steered(position=1, text="a")  # its step not recorded then


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (EventKind.TOKEN, {"text": "no step"}),
        (EventKind.STEP, {"index": "first", "text": "a"}),
        (EventKind.END, {}),
    ],
)
def test_data_that_does_not_fit_its_kind_is_a_codec_error(
    kind: EventKind, data: dict[str, Any]
) -> None:
    with pytest.raises(CodecError, match=kind.value):
        _ = Event(turn_id="t", seq=1, kind=kind, data=data).payload


def test_every_payload_has_a_json_schema() -> None:
    for kind in EventKind:
        schema = payload_adapter(kind).json_schema()
        assert schema["type"] == "object" and schema["properties"], kind
