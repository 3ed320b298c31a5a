"""The context budget: oldest tool results go first, then the oldest turns, each behind a
marker the model sees; the current turn and the results about to be answered stay; the
result is still a complete replay; the store keeps everything."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import parley
from parley.engine.context import check_replay
from parley.errors import InvalidRequest
from parley.ports.budget import ContextBudget, elided_result_marker, estimate_tokens
from parley.schemas.messages import (
    AssistantMessage,
    Message,
    Prefix,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from tests.support.helpers import RecordingModel

PREFIX = Prefix(system_prompt="be brief", tools=())


def round_of(n: int, content: str) -> list[Message]:
    """One tool round: an assistant call and its result."""
    call = ToolCall(id=f"c{n}", name="read_file", arguments='{"path": "x"}')
    return [
        AssistantMessage(text="", tool_calls=(call,)),
        ToolMessage(call_id=f"c{n}", name="read_file", content=content),
    ]


def turn_of(n: int, result_chars: int = 400) -> list[Message]:
    """A whole past turn: prompt, one tool round, a final answer."""
    return [
        UserMessage(text=f"question {n}", origin="prompt"),
        *round_of(n, "r" * result_chars),
        AssistantMessage(text=f"answer {n}"),
    ]


def history(turns: int, result_chars: int = 400) -> tuple[Message, ...]:
    return tuple(m for n in range(turns) for m in turn_of(n, result_chars))


def shape(message: Message) -> tuple[str, str]:
    if isinstance(message, ToolMessage):
        return ("tool", message.call_id)
    if isinstance(message, AssistantMessage):
        return ("assistant", ",".join(c.id for c in message.tool_calls))
    return ("user", message.origin)


def test_under_the_limit_nothing_changes() -> None:
    budget = ContextBudget(max_tokens=100_000)
    past = history(3)
    current = (UserMessage(text="now", origin="prompt"),)
    assert budget.fit(PREFIX, past, current) == past + current


def test_oldest_tool_results_are_elided_first_behind_a_marker() -> None:
    past = history(4)  # 4 results of 100 tokens each
    current = (UserMessage(text="now", origin="prompt"),)
    full = ContextBudget(max_tokens=10**6).tokens(PREFIX, past + current)
    budget = ContextBudget(max_tokens=full - 150)  # two elisions are enough
    fitted = budget.fit(PREFIX, past, current)
    results = [m for m in fitted if isinstance(m, ToolMessage)]
    assert [r.content for r in results[:2]] == [elided_result_marker(400)] * 2
    assert [r.content for r in results[2:]] == ["r" * 400] * 2
    assert len(fitted) == len(past) + 1  # no turn dropped: eliding results was enough
    assert budget.tokens(PREFIX, fitted) <= budget.max_tokens
    check_replay(fitted)


def test_then_the_oldest_turns_go_with_a_marker_ahead_of_the_first_kept_prompt() -> None:
    past = history(10, result_chars=40)
    current = (UserMessage(text="now", origin="prompt"),)
    budget = ContextBudget(max_tokens=60)
    fitted = budget.fit(PREFIX, past, current)
    prompts = [m for m in fitted if isinstance(m, UserMessage) and m.origin == "prompt"]
    assert prompts[0].text.startswith("[parley elided the ")
    assert "oldest turns" in prompts[0].text
    assert prompts[-1].text == "now"
    assert budget.tokens(PREFIX, fitted) <= budget.max_tokens
    check_replay(fitted)
    # What is kept is the newest part of the history, whole turns, in order.
    kept_questions = [p.text.rsplit("\n\n", 1)[-1] for p in prompts[:-1]]
    assert kept_questions == [f"question {n}" for n in range(10 - len(kept_questions), 10)]


def test_the_current_turn_and_the_results_being_answered_stay_whole() -> None:
    current = (
        UserMessage(text="now", origin="prompt"),
        *round_of(90, "a" * 4000),
        *round_of(91, "b" * 4000),
    )
    budget = ContextBudget(max_tokens=50)
    fitted = budget.fit(PREFIX, history(3), current)
    assert fitted[0].text.startswith("[parley elided the 3 oldest turns")  # type: ignore[union-attr]
    results = [m for m in fitted if isinstance(m, ToolMessage)]
    # The older result of this turn is elided; the one the model is answering is not.
    assert results[0].content == elided_result_marker(4000)
    assert results[1].content == "b" * 4000
    check_replay(fitted)


def test_a_host_supplied_counter_is_used() -> None:
    words = ContextBudget(max_tokens=10**6, counter=lambda text: len(text.split()))
    assert words.tokens(PREFIX, [UserMessage(text="one two three")]) == 3 + words.tokens(PREFIX, [])
    assert estimate_tokens("abcd" * 10) == 10


@pytest.mark.parametrize("limit", [0, -5, 1.5, True, "100"])
def test_a_bad_limit_is_a_clear_error(limit: object) -> None:
    with pytest.raises(InvalidRequest):
        ContextBudget(max_tokens=limit)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=3000), min_size=0, max_size=12),
    current_rounds=st.integers(min_value=0, max_value=3),
    limit=st.integers(min_value=1, max_value=5000),
)
def test_whatever_the_limit_a_fitted_request_is_a_complete_replay(
    sizes: list[int], current_rounds: int, limit: int
) -> None:
    past = tuple(m for n, size in enumerate(sizes) for m in turn_of(n, size))
    current: tuple[Message, ...] = (
        UserMessage(text="now", origin="prompt"),
        *(m for k in range(current_rounds) for m in round_of(100 + k, "z" * 999)),
    )
    budget = ContextBudget(max_tokens=limit)
    fitted = budget.fit(PREFIX, past, current)
    check_replay(fitted)
    # The current turn is always there, in order: its prompt may carry a marker and its
    # older results may be elided, but every message keeps its place and its call.
    tail = fitted[-len(current) :]
    assert tail[0].text.endswith("now")  # type: ignore[union-attr]
    assert [shape(m) for m in tail] == [shape(m) for m in current]
    if current_rounds:
        assert tail[-1] == current[-1]  # the result being answered is whole
    # Either it fits, or everything that could go is gone.
    if budget.tokens(PREFIX, fitted) > limit:
        assert not any(isinstance(m, UserMessage) and m.text.startswith("question") for m in fitted)


def test_an_embedded_session_sends_fitted_requests_and_stores_everything(
    tmp_path: Path,
) -> None:
    (tmp_path / "big.txt").write_text("x" * 8000)
    rules = [
        {
            "when": "read",
            "steps": [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]},
                {"text": "read it"},
            ],
        },
    ]
    model = RecordingModel(parley.models.ScriptedModel({"rules": rules}))
    host = parley.Host(model=model, context_budget=parley.ContextBudget(max_tokens=2500))
    with parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=host) as client:
        session = client.open_session(str(tmp_path))
        for n in range(3):
            assert session.turn(f"read the file, round {n}").outcome == parley.TurnStatus.FINISHED
        last = model.requests[-1].messages
        results = [m for m in last if isinstance(m, ToolMessage)]
        # Only the result the model is answering is whole: 8000 characters do not fit twice.
        assert [r.content for r in results[-1:]] == ["x" * 8000]
        assert all(r.content == elided_result_marker(8000) for r in results[:-1])
        # The store lost nothing.
        for turn in session.history():
            steps = client.store.steps_of(turn.turn_id)
            assert steps[0].payload.tool_results[0].content == "x" * 8000
