"""The AI SDK projection on its own: parley events in, UI message stream chunks out,
checked against the rules the ``ai`` package's ``processUIMessageStream`` enforces and
against what it builds of them (a model of it below)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parley.gateway.projections.aisdk import UiMessageStream
from parley.schemas.events import (
    AgentEnded,
    AgentStarted,
    ApprovalAnswered,
    ApprovalRequested,
    Checked,
    Compacted,
    Ended,
    Event,
    EventPayload,
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
)
from parley.schemas.messages import ToolCall

TURN = "11111111-2222-3333-4444-555555555555"
IDS = {"sessionId": "session", "turnId": TURN}


def events_of(*payloads: EventPayload) -> list[Event]:
    return [Event.of(TURN, seq, p) for seq, p in enumerate(payloads, 1)]


def project(events: list[Event], cut: str | None = None) -> list[dict[str, Any]]:
    stream = UiMessageStream(session_id="session", turn_id=TURN)
    out = stream.opening()
    for event in events:
        out += stream.feed(event)
    return out + stream.close(cut)


def build(chunks: list[dict[str, Any]], message: dict[str, Any] | None = None) -> dict[str, Any]:
    """What ``processUIMessageStream`` makes of ``chunks`` (the parts of the one assistant
    message; ``message`` continued if given), failing where it throws: a delta or an end
    for a text part not open, a tool output for a call it has not seen."""
    assert chunks[0]["type"] == "start"
    if message is None:
        message = {"id": chunks[0]["messageId"], "metadata": None, "parts": []}
    active: dict[str, dict[str, Any]] = {}
    tools = {p["toolCallId"]: p for p in message["parts"] if p["type"].startswith("tool-")}
    for chunk in chunks:
        kind = chunk["type"]
        if kind == "start":
            message["metadata"] = chunk.get("messageMetadata")
        elif kind == "start-step":
            message["parts"].append({"type": "step-start"})
        elif kind == "finish-step":
            active.clear()
        elif kind == "text-start":
            part = {"type": "text", "text": "", "providerMetadata": chunk.get("providerMetadata")}
            active[chunk["id"]] = part
            message["parts"].append(part)
        elif kind == "text-delta":
            active[chunk["id"]]["text"] += chunk["delta"]
        elif kind == "text-end":
            del active[chunk["id"]]
        elif kind == "tool-input-available":
            part = {
                "type": f"tool-{chunk['toolName']}",
                "toolCallId": chunk["toolCallId"],
                "state": "input-available",
                "input": chunk["input"],
            }
            tools[chunk["toolCallId"]] = part
            message["parts"].append(part)
        elif kind == "tool-output-available":
            tools[chunk["toolCallId"]].update(state="output-available", output=chunk["output"])
        elif kind == "tool-output-error":
            tools[chunk["toolCallId"]].update(state="output-error", errorText=chunk["errorText"])
        elif kind == "tool-approval-request":
            tools[chunk["toolCallId"]].update(
                state="approval-requested", approval={"id": chunk["approvalId"]}
            )
        elif kind == "tool-output-denied":
            tools[chunk["toolCallId"]]["state"] = "output-denied"
        elif kind.startswith("data-"):
            message["parts"].append({"type": kind, "id": chunk["id"], "data": chunk["data"]})
        elif kind in ("finish", "message-metadata"):
            if chunk.get("messageMetadata") is not None:
                message["metadata"] = {**(message["metadata"] or {}), **chunk["messageMetadata"]}
        else:
            assert kind in ("error", "abort"), kind
    return message


def check(chunks: list[dict[str, Any]]) -> None:
    """Steps are balanced, nothing follows the terminal chunk, text parts close before
    their step does."""
    open_step = False
    texts: set[str] = set()
    for n, chunk in enumerate(chunks):
        kind = chunk["type"]
        if kind == "start-step":
            assert not open_step
            open_step = True
        elif kind == "finish-step":
            assert open_step and not texts
            open_step = False
        elif kind == "text-start":
            assert open_step
            texts.add(chunk["id"])
        elif kind == "text-end":
            texts.remove(chunk["id"])
        elif kind in ("finish", "abort"):
            assert n == len(chunks) - 1 and not open_step
    build(chunks)


def texts(message: dict[str, Any], dropped: Collection[str] = ()) -> list[str]:
    return [
        p["text"]
        for p in message["parts"]
        if p["type"] == "text" and p["providerMetadata"]["parley"]["textId"] not in dropped
    ]


def retracted(message: dict[str, Any]) -> set[str]:
    """The text ids a UI hides: those every restart part names."""
    return {
        text_id
        for p in message["parts"]
        if p["type"] == "data-parley-step-restarted"
        for text_id in p["data"]["textIds"]
    }


READ = ToolCall(id="call_0_0", name="read_file", arguments='{"path": "a.txt"}')


def test_a_tool_round_maps_to_steps_text_and_tool_parts() -> None:
    out = project(
        events_of(
            Queued(run_id="r"),
            Started(run_id="r", attempt=1, worker="w"),
            Token(step=0, text="Let me "),
            Token(step=0, text="look."),
            ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments='{"path": "a.txt"}'),
            ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
            StepCommitted(step=0, text="Let me look.", tool_calls=(READ,)),
            Token(step=1, text="It says A."),
            StepCommitted(step=1, text="It says A."),
            Ended(outcome="finished", reply="It says A."),
        )
    )
    check(out)
    assert [c["type"] for c in out] == [
        "start",
        "start-step",
        "text-start",
        "text-delta",
        "text-delta",
        "text-end",
        "tool-input-available",
        "tool-output-available",
        "finish-step",
        "start-step",
        "text-start",
        "text-delta",
        "text-end",
        "finish-step",
        "finish",
    ]
    assert out[0] == {"type": "start", "messageId": TURN, "messageMetadata": {"parley": IDS}}
    assert out[6] == {
        "type": "tool-input-available",
        "toolCallId": "call_0_0",
        "toolName": "read_file",
        "input": {"path": "a.txt"},
    }
    assert out[7] == {"type": "tool-output-available", "toolCallId": "call_0_0", "output": "A"}
    assert out[-1] == {
        "type": "finish",
        "finishReason": "stop",
        "messageMetadata": {"parley": {**IDS, "outcome": "finished"}},
    }
    message = build(out)
    assert [p["type"] for p in message["parts"]] == [
        "step-start",
        "text",
        "tool-read_file",
        "step-start",
        "text",
    ]
    assert texts(message) == ["Let me look.", "It says A."]
    assert message["parts"][2]["state"] == "output-available"


def test_a_wait_for_capacity_is_a_data_part_and_changes_nothing_else() -> None:
    # A turn that waited twice: before its first call, and after its first step (let go,
    # queued again, started on another attempt).
    first: list[EventPayload] = [
        Queued(run_id="r"),
        Started(run_id="r", attempt=1, worker="w"),
    ]
    step0: list[EventPayload] = [
        Token(step=0, text="Let me look."),
        ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments='{"path": "a.txt"}'),
        ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
        StepCommitted(step=0, text="Let me look.", tool_calls=(READ,)),
    ]
    rest: list[EventPayload] = [
        Token(step=1, text="It says A."),
        StepCommitted(step=1, text="It says A."),
        Ended(outcome="finished", reply="It says A."),
    ]

    def waited(attempt: int, seconds: float) -> list[EventPayload]:
        return [
            Throttled(model="openai:gpt-test", seconds=seconds, reason="requests"),
            Queued(run_id="r"),
            Started(run_id="r", attempt=attempt, worker="w"),
        ]

    plain = project(events_of(*first, *step0, *rest))
    out = project(events_of(*first, *waited(2, 2.5), *step0, *waited(3, 0.25), *rest))
    check(out)
    throttled = [c for c in out if c["type"] == "data-parley-throttled"]
    assert throttled == [
        {
            "type": "data-parley-throttled",
            "id": "throttled:3",
            "data": {"model": "openai:gpt-test", "seconds": 2.5},
        },
        {
            "type": "data-parley-throttled",
            "id": "throttled:10",
            "data": {"model": "openai:gpt-test", "seconds": 0.25},
        },
    ]
    kinds = [c["type"] for c in out]
    assert kinds.index("data-parley-throttled") == 1  # before the first step
    second = kinds.index("data-parley-throttled", 2)
    assert kinds[second - 1 : second + 2] == ["finish-step", "data-parley-throttled", "start-step"]
    assert [c for c in out if c["type"] != "data-parley-throttled"] == plain
    shown = build(out)
    shown["parts"] = [p for p in shown["parts"] if p["type"] != "data-parley-throttled"]
    assert shown == build(plain)


def test_errors_refusals_steers_and_checks() -> None:
    out = project(
        events_of(
            Steered(position=1, text="only docs"),
            ToolCalled(step=0, call_id="c", name="write_file", arguments="not json"),
            Refused(call_id="c", tool="write_file", rule="deny_write", reason="secrets/**"),
            ToolAnswered(
                step=0,
                call_id="c",
                name="write_file",
                content="refused by policy rule deny_write: secrets/**",
                is_error=True,
                refusal="deny_write",
            ),
            StepCommitted(step=0, text=""),
            Checked(passed=False, exit_code=1, output="1 failed"),
            Ended(outcome="check_failed"),
        )
    )
    check(out)
    message = build(out)
    tool = next(p for p in message["parts"] if p["type"] == "tool-write_file")
    assert tool["input"] == "not json"  # not JSON: the arguments' text
    assert tool["state"] == "output-error"
    assert tool["errorText"] == "refused by policy rule deny_write: secrets/**"
    data = [(p["type"], p["data"]) for p in message["parts"] if p["type"].startswith("data-")]
    assert data == [
        ("data-parley-steer", {"position": 1, "text": "only docs"}),
        (
            "data-parley-refusal",
            {"toolCallId": "c", "tool": "write_file", "rule": "deny_write", "reason": "secrets/**"},
        ),
        ("data-parley-check", {"passed": False, "exitCode": 1, "output": "1 failed"}),
    ]
    assert out[-1]["finishReason"] == "other"


def test_terminal_chunks_by_outcome() -> None:
    def last(outcome: str, **fields: Any) -> list[dict[str, Any]]:
        out = project(events_of(Token(step=0, text="x"), Ended(outcome=outcome, **fields)))
        check(out)
        return out[-2:]

    metadata = {"parley": {**IDS, "outcome": "budget_exceeded"}}
    assert last("budget_exceeded")[-1] == {
        "type": "finish",
        "finishReason": "length",
        "messageMetadata": metadata,
    }
    assert last("succeeded", reply="x")[-1]["finishReason"] == "stop"
    assert last("failed", error="model failed: boom") == [
        {"type": "error", "errorText": "model failed: boom"},
        {
            "type": "finish",
            "finishReason": "error",
            "messageMetadata": {"parley": {**IDS, "outcome": "failed"}},
        },
    ]
    assert last("cancelled") == [
        {
            "type": "message-metadata",
            "messageMetadata": {"parley": {**IDS, "outcome": "cancelled"}},
        },
        {"type": "abort", "reason": "cancelled"},
    ]
    cut = project(events_of(Token(step=0, text="x")), cut="the reader fell behind")
    assert cut[-1] == {"type": "error", "errorText": "the reader fell behind"}
    assert [c["type"] for c in cut[-3:-1]] == ["text-end", "finish-step"]


def test_a_restarted_step_names_the_text_it_retracts() -> None:
    out = project(
        events_of(
            Token(step=0, text="provisional"),
            StepRestarted(step=0, reason="resumed"),
            Token(step=0, text="final"),
            StepCommitted(step=0, text="final"),
            Ended(outcome="finished", reply="final"),
        )
    )
    check(out)
    message = build(out)
    # One step throughout; the redone text is a part of its own.
    assert [p["type"] for p in message["parts"]] == [
        "step-start",
        "text",
        "data-parley-step-restarted",
        "text",
    ]
    restart = message["parts"][2]["data"]
    assert restart == {"step": 0, "reason": "resumed", "textIds": [f"{TURN}:0"]}
    assert texts(message, retracted(message)) == ["final"]


def test_a_replay_without_tokens_shows_the_committed_text() -> None:
    out = project(
        events_of(
            StepCommitted(step=0, text="It says A."), Ended(outcome="finished", reply="It says A.")
        )
    )
    check(out)
    assert texts(build(out)) == ["It says A."]


def test_a_resumed_turn_is_one_message_ending_on_its_last_end() -> None:
    out = project(
        events_of(
            Token(step=0, text="first"),
            StepCommitted(step=0, text="first"),
            Ended(outcome="cancelled"),
            Queued(run_id="r", resume=True),
            Token(step=1, text="then done"),
            StepCommitted(step=1, text="then done"),
            Ended(outcome="finished", reply="then done"),
        )
    )
    check(out)
    assert [c["type"] for c in out].count("finish") == 1
    assert out[-1]["finishReason"] == "stop"
    assert texts(build(out)) == ["first", "then done"]


step_plan = st.tuples(
    st.lists(st.text(min_size=1, max_size=4), max_size=4),
    st.lists(st.lists(st.text(min_size=1, max_size=4), max_size=3), max_size=2),
    st.booleans(),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(step_plan, min_size=1, max_size=4))
def test_any_turn_projects_to_a_valid_stream_showing_the_committed_steps(
    plans: list[tuple[list[str], list[list[str]], bool, bool]],
) -> None:
    payloads: list[EventPayload] = [Queued(run_id="r")]
    committed: list[str] = []
    for index, (chunks, redos, calls_tool, tokens_kept) in enumerate(plans):
        attempts = [chunks, *redos]
        for n, attempt in enumerate(attempts):
            if n:
                payloads.append(StepRestarted(step=index, reason="failed"))
            if tokens_kept:
                payloads += [Token(step=index, text=c) for c in attempt]
        text = "".join(attempts[-1])
        calls: tuple[ToolCall, ...] = ()
        if calls_tool:
            call = ToolCall(id=f"call_{index}_0", name="list_files", arguments="{}")
            calls = (call,)
            payloads.append(ToolCalled(step=index, call_id=call.id, name=call.name, arguments="{}"))
            payloads.append(ToolAnswered(step=index, call_id=call.id, name=call.name, content="-"))
        payloads.append(StepCommitted(step=index, text=text, tool_calls=calls))
        committed.append(text)
    payloads.append(Ended(outcome="finished", reply=committed[-1]))
    out = project(events_of(*payloads))
    check(out)
    message = build(out)
    assert texts(message, retracted(message)) == [t for t in committed if t]
    assert sum(p["type"] == "step-start" for p in message["parts"]) == len(plans)


ASKED = ApprovalRequested(
    approval_id="ap1", step=0, call_id="call_0_0", tool="record_call", arguments={"note": "a"}
)


@pytest.mark.parametrize("decision", ["approved", "denied"])
def test_a_waiting_call_and_the_message_going_on_after_its_answer(decision: str) -> None:
    stream = UiMessageStream(session_id="session", turn_id=TURN)
    first = stream.opening()
    for event in events_of(Token(step=0, text="Recording."), ASKED):
        first += stream.feed(event)
    assert stream.asked == {"ap1"}
    assert stream.interrupt(["ap1", "unseen"]) == []
    first += stream.interrupt(["ap1"])
    check(first)
    assert [c["type"] for c in first][-4:] == [
        "tool-input-available",
        "tool-approval-request",
        "finish-step",
        "finish",
    ]
    assert first[-1] == {
        "type": "finish",
        "finishReason": "tool-calls",
        "messageMetadata": {"parley": {**IDS, "outcome": "waiting"}},
    }
    waiting = build(first)
    assert waiting["parts"][-1]["state"] == "approval-requested"
    # The request carrying the answer: the stream goes on after the approval request,
    # into the message the client holds, in its open step.
    going_on = UiMessageStream(
        session_id="session", turn_id=TURN, open_step=0, asked={"ap1": "call_0_0"}
    )
    denied = decision == "denied"
    result = "the operator denied this call" if denied else "recorded"
    rest = going_on.opening()
    for event in [
        Event.of(TURN, 3, ApprovalAnswered(approval_id="ap1", decision=decision)),
        Event.of(
            TURN, 4, ToolCalled(step=0, call_id="call_0_0", name="record_call", arguments="{}")
        ),
        Event.of(
            TURN,
            5,
            ToolAnswered(
                step=0, call_id="call_0_0", name="record_call", content=result, is_error=denied
            ),
        ),
        Event.of(TURN, 6, StepCommitted(step=0, text="Recording.")),
        Event.of(TURN, 7, Token(step=1, text="done")),
        Event.of(TURN, 8, StepCommitted(step=1, text="done")),
        Event.of(TURN, 9, Ended(outcome="finished", reply="done")),
    ]:
        rest += going_on.feed(event)
    rest += going_on.close()
    kinds = [c["type"] for c in rest]
    assert "tool-input-available" not in kinds  # the client shows the call already
    assert kinds[1] != "start-step"  # and its step
    message = build(rest, waiting)
    assert part_types(message) == ["step-start", "text", "tool-record_call", "step-start", "text"]
    assert texts(message) == ["Recording.", "done"]
    tool = message["parts"][2]
    if denied:
        assert tool["state"] == "output-denied"
        assert "tool-output-error" not in kinds
    else:
        assert (tool["state"], tool["output"]) == ("output-available", "recorded")


def part_types(message: dict[str, Any]) -> list[str]:
    return [p["type"] for p in message["parts"]]


def test_a_child_turn_is_one_agent_part_updated_when_it_ends() -> None:
    started = AgentStarted(call_id="call_0_0", agent="researcher", turn_id="t2", session_id="s2")
    out = project(
        events_of(
            Queued(run_id="r"),
            Started(run_id="r", attempt=1, worker="w"),
            Token(step=0, text="Asking."),
            started,
            AgentEnded(call_id="call_0_0", outcome="finished", agent="researcher", turn_id="t2"),
            Queued(run_id="r"),
            Started(run_id="r", attempt=2, worker="w"),
            StepCommitted(step=0, text="Asking."),
            Token(step=1, text="Done."),
            StepCommitted(step=1, text="Done."),
            Ended(outcome="finished", reply="Done."),
        )
    )
    check(out)
    parts = [c for c in out if c["type"] == "data-parley-agent"]
    assert parts == [
        {
            "type": "data-parley-agent",
            "id": "agent:call_0_0",
            "data": {**started.to_json(), "status": "running"},
        },
        {
            "type": "data-parley-agent",
            "id": "agent:call_0_0",  # the same part: the client replaces the first
            "data": {
                "call_id": "call_0_0",
                "agent": "researcher",
                "turn_id": "t2",
                "status": "finished",
            },
        },
    ]


COMPACTED = Compacted(
    compaction_id="k1",
    through_turn_id="t0",
    strategy="summarize",
    text="## Goal\nread a.txt",
    tokens_before=900,
    tokens_after=40,
)
COMPACTED_VALUE = {
    "compactionId": "k1",
    "throughTurnId": "t0",
    "strategy": "summarize",
    "text": "## Goal\nread a.txt",
    "tokensBefore": 900,
    "tokensAfter": 40,
}


def test_a_compaction_is_a_data_part_and_changes_nothing_else() -> None:
    first: list[EventPayload] = [Queued(run_id="r"), Started(run_id="r", attempt=1, worker="w")]
    rest: list[EventPayload] = [
        Token(step=0, text="It says A."),
        StepCommitted(step=0, text="It says A."),
        Ended(outcome="finished", reply="It says A."),
    ]
    plain = project(events_of(*first, *rest))
    out = project(events_of(*first, COMPACTED, *rest))
    check(out)
    parts = [c for c in out if c["type"] == "data-parley-compacted"]
    assert parts == [
        {"type": "data-parley-compacted", "id": "compacted:k1", "data": COMPACTED_VALUE}
    ]
    assert [c for c in out if c["type"] != "data-parley-compacted"] == plain


def test_a_wait_for_an_event_is_a_data_part_and_changes_nothing_else() -> None:
    # A call that waited for an event (docs/time.md#waiting-for-an-event): its result came
    # on the attempt the signal queued.
    called: list[EventPayload] = [
        Queued(run_id="r"),
        Started(run_id="r", attempt=1, worker="w"),
        Token(step=0, text="Let me look."),
        ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments='{"path": "a.txt"}'),
    ]
    answered: list[EventPayload] = [
        ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
        StepCommitted(step=0, text="Let me look.", tool_calls=(READ,)),
        Token(step=1, text="It says A."),
        StepCommitted(step=1, text="It says A."),
        Ended(outcome="finished", reply="It says A."),
    ]
    waited: list[EventPayload] = [
        WaitingForEvent(step=0, call_id="call_0_0", event="go", until=None),
        Queued(run_id="r"),
        Started(run_id="r", attempt=2, worker="w"),
    ]
    plain = project(events_of(*called, *answered))
    out = project(events_of(*called, *waited, *answered))
    check(out)
    parts = [c for c in out if c["type"] == "data-parley-waiting"]
    assert parts == [
        {
            "type": "data-parley-waiting",
            "id": "waiting:call_0_0",
            "data": {"callId": "call_0_0", "event": "go", "until": None},
        }
    ]
    assert [c for c in out if c["type"] != "data-parley-waiting"] == plain
