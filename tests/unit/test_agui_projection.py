"""The AG-UI projection on its own: parley events in, AG-UI events out, checked against
the rules ``@ag-ui/client`` enforces (``verifyEvents``) and against what its default
``apply`` makes of them (a model of it below), including a restarted step's text being
dropped and a replay into messages the client already holds adding nothing twice."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from parley.gateway.projections.agui import AgUiRun
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
USER = {"id": "u1", "role": "user", "content": "hello"}


def events_of(*payloads: EventPayload) -> list[Event]:
    return [Event.of(TURN, seq, p) for seq, p in enumerate(payloads, 1)]


def project(
    events: list[Event], input_messages: list[dict[str, Any]] | None = None, cut: str | None = None
) -> list[dict[str, Any]]:
    run = AgUiRun(
        thread_id="thread",
        run_id="run",
        session_id="session",
        turn_id=TURN,
        input_messages=[USER] if input_messages is None else input_messages,
    )
    out = run.opening()
    for event in events:
        out += run.feed(event)
    return out + run.close(cut)


def verify(events: list[dict[str, Any]]) -> None:
    """The sequencing rules of ``@ag-ui/client``'s ``verifyEvents`` that a producer can
    break: RUN_STARTED first, nothing after the run's end, text and tool calls opened
    before use and closed before RUN_FINISHED, steps balanced."""
    assert events[0]["type"] == "RUN_STARTED"
    texts: set[str] = set()
    calls: set[str] = set()
    steps: set[str] = set()
    for n, event in enumerate(events):
        kind = event["type"]
        if kind in ("RUN_FINISHED", "RUN_ERROR"):
            assert n == len(events) - 1, "an event after the run's end"
            if kind == "RUN_FINISHED":
                assert not texts and not calls and not steps, (texts, calls, steps)
        elif kind == "TEXT_MESSAGE_START":
            assert event["messageId"] not in texts
            texts.add(event["messageId"])
        elif kind in ("TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"):
            assert event["messageId"] in texts
            if kind == "TEXT_MESSAGE_END":
                texts.remove(event["messageId"])
        elif kind == "TOOL_CALL_START":
            assert event["toolCallId"] not in calls
            calls.add(event["toolCallId"])
        elif kind in ("TOOL_CALL_ARGS", "TOOL_CALL_END"):
            assert event["toolCallId"] in calls
            if kind == "TOOL_CALL_END":
                calls.remove(event["toolCallId"])
        elif kind == "STEP_STARTED":
            assert event["stepName"] not in steps
            steps.add(event["stepName"])
        elif kind == "STEP_FINISHED":
            steps.remove(event["stepName"])


def apply(messages: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What ``@ag-ui/client``'s default apply makes of ``events`` on ``messages``: a text
    message found by id (made if new) gets each delta appended; a tool call goes on its
    parent message (made if new); a result is a tool message after its call's message (and
    the tool messages already there); a
    snapshot keeps only the messages it lists (in the client's order), adding the rest."""
    held = [dict(m) for m in messages]

    def find(message_id: str) -> dict[str, Any] | None:
        return next((m for m in held if m["id"] == message_id), None)

    for event in events:
        kind = event["type"]
        if kind == "TEXT_MESSAGE_START" and find(event["messageId"]) is None:
            held.append({"id": event["messageId"], "role": "assistant", "content": ""})
        elif kind == "TEXT_MESSAGE_CONTENT":
            message = find(event["messageId"])
            assert message is not None
            message["content"] = (message.get("content") or "") + event["delta"]
        elif kind == "TOOL_CALL_START":
            parent = find(event["parentMessageId"])
            if parent is None:
                parent = {"id": event["parentMessageId"], "role": "assistant"}
                held.append(parent)
            parent.setdefault("toolCalls", []).append(
                {
                    "id": event["toolCallId"],
                    "type": "function",
                    "function": {"name": event["toolCallName"], "arguments": ""},
                }
            )
        elif kind == "TOOL_CALL_ARGS":
            call = next(
                c for m in held for c in m.get("toolCalls", []) if c["id"] == event["toolCallId"]
            )
            call["function"]["arguments"] += event["delta"]
        elif kind == "TOOL_CALL_RESULT":
            result = {
                "id": event["messageId"],
                "role": "tool",
                "toolCallId": event["toolCallId"],
                "content": event["content"],
            }
            calling = [
                n
                for n, m in enumerate(held)
                if any(c["id"] == event["toolCallId"] for c in m.get("toolCalls", []))
            ]
            if not calling:
                held.append(result)
                continue
            at = calling[0] + 1
            while at < len(held) and held[at]["role"] == "tool":
                at += 1
            held.insert(at, result)
        elif kind == "MESSAGES_SNAPSHOT":
            given_ids = {m["id"] for m in event["messages"]}
            by_id = {m["id"]: m for m in event["messages"]}
            held = [dict(by_id[m["id"]]) for m in held if m["id"] in given_ids]
            kept = {m["id"] for m in held}
            held += [dict(m) for m in event["messages"] if m["id"] not in kept]
    return held


def texts_of(messages: list[dict[str, Any]]) -> list[str]:
    return [m.get("content") or "" for m in messages if m["role"] == "assistant"]


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


READ = ToolCall(id="call_0_0", name="read_file", arguments='{"path": "a.txt"}')


def tool_turn() -> list[Event]:
    return events_of(
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


def test_a_tool_round_maps_to_steps_text_and_tool_call_events() -> None:
    out = project(tool_turn())
    verify(out)
    assert types(out) == [
        "RUN_STARTED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "STEP_FINISHED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    assert out[0]["metadata"] == {"parley": {"sessionId": "session", "turnId": TURN}}
    start = out[6]
    assert start == {
        "type": "TOOL_CALL_START",
        "toolCallId": f"{TURN}:call_0_0",
        "toolCallName": "read_file",
        "parentMessageId": f"{TURN}:0",
    }
    assert out[7]["delta"] == '{"path": "a.txt"}'
    assert out[9] == {
        "type": "TOOL_CALL_RESULT",
        "messageId": f"{TURN}:call_0_0:result",
        "toolCallId": f"{TURN}:call_0_0",
        "content": "A",
        "role": "tool",
    }
    assert out[-1] == {
        "type": "RUN_FINISHED",
        "threadId": "thread",
        "runId": "run",
        "metadata": {"parley": {"sessionId": "session", "turnId": TURN, "outcome": "finished"}},
        "outcome": {"type": "success"},
        "result": {"outcome": "finished", "reply": "It says A."},
    }
    messages = apply([USER], out)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert texts_of(messages) == ["Let me look.", "It says A."]
    assert messages[1]["toolCalls"][0]["function"]["arguments"] == '{"path": "a.txt"}'


def with_waits(events: list[Event]) -> list[Event]:
    """``events`` as a turn that waited for capacity twice tells them: before its first
    call, and after its first step (let go, queued again, started on another attempt)."""
    payloads = [e.payload for e in events]
    after_start = 2  # queued, started
    after_step = next(n for n, p in enumerate(payloads) if isinstance(p, StepCommitted)) + 1
    waited = [
        *payloads[:after_start],
        Throttled(model="openai:gpt-test", seconds=2.5, reason="requests"),
        Queued(run_id="r"),
        Started(run_id="r", attempt=2, worker="w"),
        *payloads[after_start:after_step],
        Throttled(model="openai:gpt-test", seconds=0.0, reason="tokens"),
        Queued(run_id="r"),
        Started(run_id="r", attempt=3, worker="w"),
        *payloads[after_step:],
    ]
    return events_of(*waited)


def test_a_wait_for_capacity_is_a_custom_event_and_changes_nothing_else() -> None:
    plain = project(tool_turn())
    out = project(with_waits(tool_turn()))
    verify(out)
    throttled = [e for e in out if e.get("name") == "parley.throttled"]
    assert throttled == [
        {
            "type": "CUSTOM",
            "name": "parley.throttled",
            "value": {"model": "openai:gpt-test", "seconds": 2.5},
        },
        {
            "type": "CUSTOM",
            "name": "parley.throttled",
            "value": {"model": "openai:gpt-test", "seconds": 0.0},
        },
    ]
    # Each where its turn waited: before the first step, and between the two steps.
    assert types(out).index("CUSTOM") == 1
    second = [n for n, e in enumerate(out) if e.get("name") == "parley.throttled"][1]
    assert types(out)[second - 1 : second + 2] == ["STEP_FINISHED", "CUSTOM", "STEP_STARTED"]
    assert [e for e in out if e.get("name") != "parley.throttled"] == plain
    assert apply([USER], out) == apply([USER], plain)


def test_steers_refusals_and_checks_are_custom_events() -> None:
    out = project(
        events_of(
            Steered(position=1, text="only docs"),
            ToolCalled(step=0, call_id="c", name="write_file", arguments="{}"),
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
    verify(out)
    customs = [(e["name"], e["value"]) for e in out if e["type"] == "CUSTOM"]
    assert customs == [
        ("parley.steer", {"position": 1, "text": "only docs"}),
        (
            "parley.refusal",
            {
                "toolCallId": f"{TURN}:c",
                "tool": "write_file",
                "rule": "deny_write",
                "reason": "secrets/**",
            },
        ),
        ("parley.check", {"passed": False, "exitCode": 1, "output": "1 failed"}),
    ]
    # A turn that ended without a reply but did not fail still finishes the run.
    assert out[-1]["outcome"] == {"type": "success"}
    assert out[-1]["result"] == {"outcome": "check_failed", "reply": None}


def test_a_failed_turn_is_run_error_and_a_cancelled_one_finishes_cancelled() -> None:
    failed = project(
        events_of(
            Token(step=0, text="par"),
            StepRestarted(step=0, reason="failed"),
            Ended(outcome="failed", error="model failed: RuntimeError: boom"),
        )
    )
    verify(failed)
    assert failed[-1] == {
        "type": "RUN_ERROR",
        "message": "model failed: RuntimeError: boom",
        "code": "failed",
        "metadata": {"parley": {"sessionId": "session", "turnId": TURN, "outcome": "failed"}},
    }
    assert "par" not in texts_of(apply([USER], failed))

    cancelled = project(
        events_of(Token(step=0, text="partial"), Ended(outcome="cancelled", undelivered=("x",)))
    )
    verify(cancelled)
    assert cancelled[-1]["outcome"] == {"type": "cancelled"}
    assert "result" not in cancelled[-1]
    # The interrupted stream's text stays, display-only, in a closed message.
    assert texts_of(apply([USER], cancelled)) == ["partial"]
    assert types(cancelled)[-3:] == ["TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_FINISHED"]


def test_a_feed_cut_before_the_end_is_run_error() -> None:
    out = project(events_of(Token(step=0, text="so far")), cut="the reader fell behind")
    verify(out)
    assert out[-1] == {
        "type": "RUN_ERROR",
        "message": "the reader fell behind",
        "code": "stream_cut",
    }


def test_a_resumed_turn_is_one_run_ending_on_its_last_end() -> None:
    out = project(
        events_of(
            Token(step=0, text="first"),
            StepCommitted(step=0, text="first", tool_calls=()),
            Ended(outcome="cancelled"),
            Queued(run_id="r", resume=True),
            Started(run_id="r", attempt=2, worker="w"),
            Token(step=1, text="then done"),
            StepCommitted(step=1, text="then done"),
            Ended(outcome="finished", reply="then done"),
        )
    )
    verify(out)
    assert types(out).count("RUN_FINISHED") == 1
    assert out[-1]["result"] == {"outcome": "finished", "reply": "then done"}


def test_a_restarted_step_is_dropped_by_a_snapshot_and_streamed_again() -> None:
    out = project(
        events_of(
            Token(step=0, text="provisional "),
            ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments="{}"),
            ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
            StepRestarted(step=0, reason="resumed"),
            Token(step=0, text="final"),
            StepCommitted(step=0, text="final"),
            Ended(outcome="finished", reply="final"),
        )
    )
    verify(out)
    custom = next(e for e in out if e["type"] == "CUSTOM")
    assert custom["value"] == {
        "step": 0,
        "reason": "resumed",
        "messageIds": [f"{TURN}:0", f"{TURN}:call_0_0:result"],
        "toolCallIds": [f"{TURN}:call_0_0"],
    }
    snapshot = next(e for e in out if e["type"] == "MESSAGES_SNAPSHOT")
    assert snapshot["messages"] == [USER]
    # One step throughout: the redone step streams on inside it.
    assert types(out).count("STEP_STARTED") == 1
    messages = apply([USER], out)
    assert messages == [USER, {"id": f"{TURN}:0", "role": "assistant", "content": "final"}]


def test_a_snapshot_keeps_earlier_steps_of_the_run() -> None:
    out = project(
        events_of(
            Token(step=0, text="kept"),
            StepCommitted(step=0, text="kept"),
            Token(step=1, text="dropped"),
            StepRestarted(step=1, reason="diverged"),
            Token(step=1, text="redone"),
            StepCommitted(step=1, text="redone"),
            Ended(outcome="finished", reply="redone"),
        )
    )
    verify(out)
    assert texts_of(apply([USER], out)) == ["kept", "redone"]


def test_a_replay_without_tokens_shows_the_committed_text() -> None:
    # The replay buffer let the tokens go: the store's step events carry the text.
    out = project(
        events_of(
            ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments="{}"),
            ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
            StepCommitted(step=0, text="", tool_calls=(READ,)),
            StepCommitted(step=1, text="It says A."),
            Ended(outcome="finished", reply="It says A."),
        )
    )
    verify(out)
    assert texts_of(apply([USER], out)) == ["", "It says A."]


def test_a_replay_into_messages_the_client_holds_adds_only_what_it_lacks() -> None:
    first = project(tool_turn())
    whole = apply([USER], first)
    # The same run again (the same user message sent again): nothing is added twice.
    again = project(tool_turn(), input_messages=whole)
    verify(again)
    assert apply(whole, again) == whole
    assert not [e for e in again if e["type"].startswith(("TEXT_MESSAGE", "TOOL_CALL"))]
    # A client that saw the reply cut short gets the rest of it.
    cut = [dict(m) for m in whole]
    cut[-1]["content"] = "It sa"
    resent = project(tool_turn(), input_messages=cut)
    verify(resent)
    assert apply(cut, resent) == whole


def twice_restarted_turn() -> list[Event]:
    """A step redone twice (a worker died while its tool ran, then the redo's stream
    failed) before it committed."""

    def read() -> list[EventPayload]:
        return [
            ToolCalled(step=0, call_id="call_0_0", name="read_file", arguments="{}"),
            ToolAnswered(step=0, call_id="call_0_0", name="read_file", content="A"),
        ]

    return events_of(
        Token(step=0, text="Reading."),
        *read(),
        StepRestarted(step=0, reason="resumed"),
        Token(step=0, text="Rea"),
        StepRestarted(step=0, reason="failed"),
        Token(step=0, text="Reading."),
        *read(),
        StepCommitted(step=0, text="Reading.", tool_calls=(READ,)),
        Token(step=1, text="It says A."),
        StepCommitted(step=1, text="It says A."),
        Ended(outcome="finished", reply="It says A."),
    )


def test_a_replay_of_a_step_restarted_twice_holds_its_tool_result_once() -> None:
    """Replayed into what the client holds, the first restart takes the step's held
    messages back (its redo streams them again); the second must not give back the tool
    result the first took, or the redo's result is held twice."""
    first = project(twice_restarted_turn())
    verify(first)
    whole = apply([USER], first)
    assert [m["role"] for m in whole] == ["user", "assistant", "tool", "assistant"]
    again = project(twice_restarted_turn(), input_messages=whole)
    verify(again)
    assert apply(whole, again) == whole
    snapshots = [e["messages"] for e in again if e["type"] == "MESSAGES_SNAPSHOT"]
    assert len(snapshots) == 2
    assert [m["role"] for m in snapshots[1]] == ["user", "assistant", "assistant"]


def test_the_events_carry_only_fields_ag_ui_declares() -> None:
    declared = {
        "RUN_STARTED": {"type", "threadId", "runId", "metadata"},
        "RUN_FINISHED": {"type", "threadId", "runId", "metadata", "outcome", "result"},
        "RUN_ERROR": {"type", "message", "code", "metadata"},
        "STEP_STARTED": {"type", "stepName"},
        "STEP_FINISHED": {"type", "stepName"},
        "TEXT_MESSAGE_START": {"type", "messageId", "role"},
        "TEXT_MESSAGE_CONTENT": {"type", "messageId", "delta"},
        "TEXT_MESSAGE_END": {"type", "messageId"},
        "TOOL_CALL_START": {"type", "toolCallId", "toolCallName", "parentMessageId"},
        "TOOL_CALL_ARGS": {"type", "toolCallId", "delta"},
        "TOOL_CALL_END": {"type", "toolCallId"},
        "TOOL_CALL_RESULT": {"type", "messageId", "toolCallId", "content", "role"},
        "CUSTOM": {"type", "name", "value"},
        "MESSAGES_SNAPSHOT": {"type", "messages"},
    }
    restarted = events_of(Token(step=0, text="x"), StepRestarted(step=0, reason="failed"))
    for out in (project(tool_turn()), project(restarted)):
        for event in out:
            assert set(event) <= declared[event["type"]], event


# One step's stream: chunks of text, possibly a restart (then the redone text), possibly
# a tool call; and whether its tokens survived for the reader (a late replay has none).
step_plan = st.tuples(
    st.lists(st.text(min_size=1, max_size=4), max_size=4),
    st.one_of(st.none(), st.lists(st.text(min_size=1, max_size=4), max_size=3)),
    st.booleans(),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(step_plan, min_size=1, max_size=4))
def test_any_turn_projects_to_a_valid_run_whose_messages_are_the_committed_steps(
    plans: list[tuple[list[str], list[str] | None, bool, bool]],
) -> None:
    payloads: list[EventPayload] = [Queued(run_id="r")]
    committed: list[str] = []
    for index, (chunks, redone, calls_tool, tokens_kept) in enumerate(plans):
        if tokens_kept:
            payloads += [Token(step=index, text=c) for c in chunks]
        text = "".join(chunks)
        if redone is not None:
            payloads.append(StepRestarted(step=index, reason="resumed"))
            if tokens_kept:
                payloads += [Token(step=index, text=c) for c in redone]
            text = "".join(redone)
        calls: tuple[ToolCall, ...] = ()
        if calls_tool:
            call = ToolCall(id=f"call_{index}_0", name="list_files", arguments="{}")
            calls = (call,)
            payloads.append(ToolCalled(step=index, call_id=call.id, name=call.name, arguments="{}"))
            payloads.append(
                ToolAnswered(step=index, call_id=call.id, name=call.name, content="(no files)")
            )
        payloads.append(StepCommitted(step=index, text=text, tool_calls=calls))
        committed.append(text)
    payloads.append(Ended(outcome="finished", reply=committed[-1]))
    out = project(events_of(*payloads))
    verify(out)
    messages = apply([USER], out)
    shown = {m["id"]: m.get("content") or "" for m in messages if m["role"] == "assistant"}
    expected = {f"{TURN}:{i}": t for i, t in enumerate(committed) if t or plans[i][2]}
    assert shown == expected
    # And a client that holds all of it gets nothing twice from a replay.
    assert apply(messages, project(events_of(*payloads), input_messages=messages)) == messages


def asking_turn() -> list[Event]:
    return events_of(
        Token(step=0, text="Recording."),
        ApprovalRequested(
            approval_id="ap1",
            step=0,
            call_id="call_0_0",
            tool="record_call",
            arguments={"note": "a"},
            rule="ask_tools:record_call",
        ),
    )


def test_a_waiting_turn_ends_the_run_with_an_interrupt() -> None:
    run = AgUiRun(thread_id="thread", run_id="run", session_id="session", turn_id=TURN)
    out = run.opening()
    for event in asking_turn():
        out += run.feed(event)
    assert run.asked == {"ap1"}
    assert run.interrupt(["ap1", "unseen"]) == []  # not every waiting call was shown yet
    out += run.interrupt(["ap1"])
    verify(out)
    assert run.feed(asking_turn()[0]) == [] and run.close() == []  # the run is over
    assert types(out) == [
        "RUN_STARTED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "CUSTOM",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    assert out[6]["delta"] == '{"note":"a"}'
    assert out[8]["name"] == "parley.approval_requested"
    [interrupt] = out[-1]["outcome"]["interrupts"]
    assert out[-1]["outcome"]["type"] == "interrupt"
    assert interrupt["id"] == "ap1"
    assert interrupt["toolCallId"] == f"{TURN}:call_0_0"
    assert interrupt["reason"] == "tool_approval"
    assert interrupt["metadata"]["parley"]["arguments"] == {"note": "a"}
    assert "result" not in out[-1]


def test_a_resumed_run_shows_the_waiting_call_once_and_its_answer() -> None:
    rest: list[EventPayload] = [
        ApprovalAnswered(approval_id="ap1", decision="approved"),
        ToolCalled(step=0, call_id="call_0_0", name="record_call", arguments='{"note": "a"}'),
        ToolAnswered(step=0, call_id="call_0_0", name="record_call", content="recorded"),
        StepCommitted(step=0, text="Recording."),
        Token(step=1, text="done"),
        StepCommitted(step=1, text="done"),
        Ended(outcome="finished", reply="done"),
    ]
    events = [*asking_turn(), *[Event.of(TURN, 3 + n, p) for n, p in enumerate(rest)]]
    whole = project(events)
    verify(whole)
    assert types(whole).count("TOOL_CALL_START") == 1  # announced when asked, not again
    answers = customs(whole, "parley.approval_answered")
    assert answers == [{"approvalId": "ap1", "decision": "approved", "reason": None}]
    # The resume's run replays into what the interrupted run left the client holding.
    first = AgUiRun(thread_id="thread", run_id="run", session_id="session", turn_id=TURN)
    interrupted = first.opening()
    for event in asking_turn():
        interrupted += first.feed(event)
    interrupted += first.interrupt(["ap1"])
    held = apply([USER], interrupted)
    resumed = project(events, input_messages=held)
    verify(resumed)
    assert "TOOL_CALL_START" not in types(resumed)
    assert texts_of(apply(held, resumed)) == ["Recording.", "done"]


def customs(events: list[dict[str, Any]], name: str) -> list[Any]:
    return [e["value"] for e in events if e["type"] == "CUSTOM" and e["name"] == name]


def test_a_child_turn_is_told_by_custom_events() -> None:
    started = AgentStarted(call_id="call_0_0", agent="researcher", turn_id="t2", session_id="s2")
    ended = AgentEnded(call_id="call_0_0", outcome="cancelled", agent="researcher", turn_id="t2")
    out = project(
        events_of(
            Queued(run_id="r"),
            Started(run_id="r", attempt=1, worker="w"),
            Token(step=0, text="Asking."),
            started,
            ended,
            StepCommitted(step=0, text="Asking."),
            Ended(outcome="finished", reply="Asking."),
        )
    )
    verify(out)
    told = [e for e in out if e.get("name", "").startswith("parley.agent_")]
    assert told == [
        {"type": "CUSTOM", "name": "parley.agent_started", "value": started.to_json()},
        {"type": "CUSTOM", "name": "parley.agent_ended", "value": ended.to_json()},
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


def test_a_compaction_before_the_first_step_is_a_custom_event_and_changes_nothing_else() -> None:
    plain = tool_turn()
    compacted = events_of(
        *[e.payload for e in plain[:2]], COMPACTED, *[e.payload for e in plain[2:]]
    )
    out = project(compacted)
    verify(out)
    shown = [e for e in out if e.get("name") == "parley.compacted"]
    assert shown == [{"type": "CUSTOM", "name": "parley.compacted", "value": COMPACTED_VALUE}]
    assert types(out).index("CUSTOM") == 1  # after RUN_STARTED, before the first step
    assert [e for e in out if e.get("name") != "parley.compacted"] == project(plain)


def test_a_wait_for_an_event_is_a_custom_event_and_changes_nothing_else() -> None:
    events = tool_turn()
    payloads = [e.payload for e in events]
    called = next(n for n, p in enumerate(payloads) if isinstance(p, ToolCalled)) + 1
    waited = [
        *payloads[:called],
        WaitingForEvent(step=0, call_id="call_0_0", event="go", until="2027-01-04T08:00:00+00:00"),
        Queued(run_id="r"),
        Started(run_id="r", attempt=2, worker="w"),
        *payloads[called:],
    ]
    plain = project(events)
    out = project(events_of(*waited))
    verify(out)
    assert [e for e in out if e.get("name") == "parley.waiting"] == [
        {
            "type": "CUSTOM",
            "name": "parley.waiting",
            "value": {"callId": "call_0_0", "event": "go", "until": "2027-01-04T08:00:00+00:00"},
        }
    ]
    assert [e for e in out if e.get("name") != "parley.waiting"] == plain
    assert apply([USER], out) == apply([USER], plain)
