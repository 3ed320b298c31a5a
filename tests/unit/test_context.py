"""Context assembly and checked replay: stored rows become model messages,
and an incomplete tool round raises CodecError instead of reaching a provider."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parley.engine.context import assemble, check_replay, history_messages, step_messages
from parley.errors import CodecError
from parley.ports.backend import CommittedStep, PathTurn
from parley.schemas.messages import (
    AssistantMessage,
    Message,
    StepInput,
    StepPayload,
    ToolCall,
    ToolMessage,
    ToolResult,
    UserMessage,
)
from parley.schemas.records import TurnRecord, TurnStatus


def tool_call(call_id: str, name: str = "read_file") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments='{"path": "a"}')


def result(call_id: str, content: str = "ok", name: str = "read_file") -> ToolResult:
    return ToolResult(call_id=call_id, name=name, content=content)


def step(
    index: int,
    text: str = "",
    calls: Sequence[ToolCall] = (),
    results: Sequence[ToolResult] = (),
    inputs: Sequence[StepInput] = (),
) -> CommittedStep:
    payload = StepPayload(
        inputs=tuple(inputs), text=text, tool_calls=tuple(calls), tool_results=tuple(results)
    )
    return CommittedStep(index=index, payload=payload)


def path_turn(prompt: str, steps: Sequence[CommittedStep], n: int = 0) -> PathTurn:
    record = TurnRecord(
        turn_id=f"turn-{n}",
        session_id="session",
        parent_id=None if n == 0 else f"turn-{n - 1}",
        prompt=prompt,
        status=TurnStatus.FINISHED,
        reply=None,
        run_id=f"run-{n}",
        request_id=None,
        created_at=datetime(2024, 1, 1, tzinfo=UTC),
    )
    return PathTurn(turn=record, steps=tuple(steps))


# ---------------------------------------------------------------------------- order


def test_assemble_order() -> None:
    history = [
        path_turn(
            "first prompt",
            [
                step(0, "reading", [tool_call("c0")], [result("c0", "file body")]),
                step(1, "first answer"),
            ],
            n=0,
        ),
        path_turn("second prompt", [step(0, "second answer")], n=1),
    ]
    this_turn = [
        step(
            0,
            "",
            [tool_call("c1"), tool_call("c2", "list_files")],
            [
                result("c2", "listing", "list_files"),
                result("c1", "body"),
            ],
        ),
        step(1, "mid", inputs=[StepInput(origin="steer", text="only docs")]),
    ]
    pending = [StepInput(origin="steer", text="hurry"), StepInput(origin="check", text="red")]

    messages = assemble(history_messages(history), "third prompt", this_turn, pending)

    assert messages == (
        UserMessage(text="first prompt", origin="prompt"),
        AssistantMessage(text="reading", tool_calls=(tool_call("c0"),)),
        ToolMessage(call_id="c0", name="read_file", content="file body"),
        AssistantMessage(text="first answer"),
        UserMessage(text="second prompt", origin="prompt"),
        AssistantMessage(text="second answer"),
        UserMessage(text="third prompt", origin="prompt"),
        AssistantMessage(text="", tool_calls=(tool_call("c1"), tool_call("c2", "list_files"))),
        # Results follow the calls' order, not the order they were stored in.
        ToolMessage(call_id="c1", name="read_file", content="body"),
        ToolMessage(call_id="c2", name="list_files", content="listing"),
        UserMessage(text="only docs", origin="steer"),
        AssistantMessage(text="mid"),
        UserMessage(text="hurry", origin="steer"),
        UserMessage(text="red", origin="check"),
    )


def test_assemble_of_a_fresh_turn_is_its_prompt() -> None:
    assert assemble((), "hello", [], []) == (UserMessage(text="hello", origin="prompt"),)


def test_step_messages_keeps_error_results() -> None:
    failed = ToolResult(call_id="c", name="read_file", content="no such file", is_error=True)
    messages = step_messages(step(3, "", [tool_call("c")], [failed]))
    assert messages[-1] == ToolMessage(
        call_id="c", name="read_file", content="no such file", is_error=True
    )


def test_call_ids_may_repeat_across_rounds() -> None:
    """The scripted model names calls by step number, so every turn reuses ``call_0_0``."""
    history = [path_turn("p", [step(0, "", [tool_call("call_0_0")], [result("call_0_0")])])]
    this_turn = [step(0, "", [tool_call("call_0_0")], [result("call_0_0")])]
    assert len(assemble(history_messages(history), "q", this_turn, [])) == 6


# ---------------------------------------------------------------------------- CodecError


def test_tool_call_without_result() -> None:
    broken = step(2, "", [tool_call("a"), tool_call("b")], [result("a")])
    with pytest.raises(CodecError, match="b"):
        step_messages(broken)
    with pytest.raises(CodecError):
        assemble((), "p", [broken], [])
    with pytest.raises(CodecError):
        assemble(history_messages([path_turn("old", [broken])]), "p", [], [])


def test_result_for_an_unknown_call() -> None:
    broken = step(0, "", [tool_call("a")], [result("a"), result("ghost")])
    with pytest.raises(CodecError, match="ghost"):
        assemble((), "p", [broken], [])
    with pytest.raises(CodecError):
        assemble((), "p", [step(0, "no calls", [], [result("ghost")])], [])


def test_duplicate_result() -> None:
    broken = step(0, "", [tool_call("a")], [result("a", "one"), result("a", "two")])
    with pytest.raises(CodecError):
        assemble((), "p", [broken], [])


def test_tool_message_with_no_open_call() -> None:
    with pytest.raises(CodecError):
        check_replay([UserMessage(text="p"), ToolMessage(call_id="x", name="t", content="r")])
    answered_twice: list[Message] = [
        UserMessage(text="p"),
        AssistantMessage(text="", tool_calls=(tool_call("x"),)),
        ToolMessage(call_id="x", name="read_file", content="r"),
        ToolMessage(call_id="x", name="read_file", content="r"),
    ]
    with pytest.raises(CodecError):
        check_replay(answered_twice)


def test_conversation_continuing_while_calls_are_open() -> None:
    opened = AssistantMessage(text="", tool_calls=(tool_call("x"), tool_call("y")))
    answered_one = ToolMessage(call_id="x", name="read_file", content="r")
    for after in (UserMessage(text="steer", origin="steer"), AssistantMessage(text="next")):
        with pytest.raises(CodecError):
            check_replay([UserMessage(text="p"), opened, answered_one, after])


def test_trailing_unanswered_call() -> None:
    with pytest.raises(CodecError):
        check_replay(
            [UserMessage(text="p"), AssistantMessage(text="", tool_calls=(tool_call("x"),))]
        )


def test_duplicate_call_id_in_one_round() -> None:
    twice = AssistantMessage(text="", tool_calls=(tool_call("x"), tool_call("x")))
    answers = [ToolMessage(call_id="x", name="read_file", content="r")] * 2
    with pytest.raises(CodecError):
        check_replay([UserMessage(text="p"), twice, *answers])


def test_check_replay_accepts_results_in_any_order_and_returns_the_messages() -> None:
    messages: list[Message] = [
        UserMessage(text="p"),
        AssistantMessage(text="", tool_calls=(tool_call("x"), tool_call("y"))),
        ToolMessage(call_id="y", name="read_file", content="r"),
        ToolMessage(call_id="x", name="read_file", content="r"),
        AssistantMessage(text="done"),
    ]
    assert check_replay(messages) == tuple(messages)


# ---------------------------------------------------------------------------- properties

texts = st.text(max_size=8)
inputs = st.lists(
    st.builds(StepInput, origin=st.sampled_from(["steer", "check"]), text=texts), max_size=2
)


@st.composite
def complete_step(draw: st.DrawFn, index: int) -> CommittedStep:
    n_calls = draw(st.integers(min_value=0, max_value=4))
    calls = [
        tool_call(f"call_{index}_{n}", draw(st.sampled_from(["a", "b"]))) for n in range(n_calls)
    ]
    results = [result(c.id, draw(texts), c.name) for c in calls]
    stored_order = draw(st.permutations(results))
    return step(index, draw(texts), calls, stored_order, draw(inputs))


@st.composite
def complete_steps(draw: st.DrawFn) -> list[CommittedStep]:
    n_steps = draw(st.integers(min_value=0, max_value=4))
    return [draw(complete_step(i)) for i in range(n_steps)]


@st.composite
def conversations(
    draw: st.DrawFn,
) -> tuple[list[PathTurn], list[CommittedStep], list[StepInput]]:
    n_turns = draw(st.integers(min_value=0, max_value=3))
    history = [path_turn(draw(texts), draw(complete_steps()), n) for n in range(n_turns)]
    return history, draw(complete_steps()), draw(inputs)


def assert_rounds_are_contiguous(messages: Sequence[Message]) -> None:
    """Every tool message sits in the run of tool messages right after the assistant
    message that called it, and that run answers exactly that message's calls."""
    position = 0
    while position < len(messages):
        message = messages[position]
        position += 1
        assert not isinstance(message, ToolMessage), "a tool message outside a round"
        if isinstance(message, AssistantMessage) and message.tool_calls:
            answered = []
            while position < len(messages) and isinstance(messages[position], ToolMessage):
                answer = messages[position]
                assert isinstance(answer, ToolMessage)
                answered.append(answer.call_id)
                position += 1
            assert answered == [c.id for c in message.tool_calls]


def loaded(turn: PathTurn) -> tuple[CommittedStep, ...]:
    """The steps of a history turn the generator made (always loaded)."""
    assert turn.steps is not None
    return turn.steps


@settings(database=None, max_examples=150, deadline=None)
@given(conversations())
def test_assemble_complete_steps(
    conversation: tuple[list[PathTurn], list[CommittedStep], list[StepInput]],
) -> None:
    history, steps, pending = conversation
    messages = assemble(history_messages(history), "now", steps, pending)
    assert_rounds_are_contiguous(messages)
    all_steps = [s for turn in history for s in loaded(turn)] + steps
    expected_length = (
        len(history)
        + 1
        + sum(1 + len(s.payload.inputs) + len(s.payload.tool_calls) for s in all_steps)
        + len(pending)
    )
    assert len(messages) == expected_length
    prompts = [m.text for m in messages if isinstance(m, UserMessage) and m.origin == "prompt"]
    assert prompts == [*(turn.turn.prompt for turn in history), "now"]
    tail = messages[len(messages) - len(pending) :]
    assert tail == tuple(UserMessage(text=i.text, origin=i.origin) for i in pending)


@settings(database=None, max_examples=150, deadline=None)
@given(conversations(), st.data())
def test_removing_any_tool_result_raises(
    conversation: tuple[list[PathTurn], list[CommittedStep], list[StepInput]],
    data: st.DataObject,
) -> None:
    history, steps, pending = conversation
    # Every (turn, step) with at least one result; turn None is the current turn.
    candidates = [
        (t, s)
        for t, turn_steps in [*((t, loaded(h)) for t, h in enumerate(history)), (None, steps)]
        for s, one in enumerate(turn_steps)
        if one.payload.tool_results
    ]
    assume(candidates)
    t, s = data.draw(st.sampled_from(candidates))
    target = (steps if t is None else loaded(history[t]))[s]
    drop = data.draw(st.integers(min_value=0, max_value=len(target.payload.tool_results) - 1))
    kept = target.payload.tool_results[:drop] + target.payload.tool_results[drop + 1 :]
    broken = step(
        target.index, target.payload.text, target.payload.tool_calls, kept, target.payload.inputs
    )
    if t is None:
        steps = [*steps[:s], broken, *steps[s + 1 :]]
    else:
        turn = history[t]
        history = [
            *history[:t],
            PathTurn(turn=turn.turn, steps=(*loaded(turn)[:s], broken, *loaded(turn)[s + 1 :])),
            *history[t + 1 :],
        ]
    with pytest.raises(CodecError):
        assemble(history_messages(history), "now", steps, pending)
