"""One tool call through validation, policy, approver, the tool and the cap: every
outcome a result the model sees and an event readers see; only a lost lock stops it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.coordination.local_coordinator import LocalCoordinator
from parley.engine.emitter import Emitter
from parley.engine.tool_calls import (
    NOT_RUN_INTERRUPTED,
    Answer,
    Judgement,
    ToolRunner,
    cap,
    unique_ids,
)
from parley.ports.host import Access, ApprovalRequest, Ask, Refusal, ToolContext
from parley.schemas.errors import Fenced
from parley.schemas.events import EventKind
from parley.schemas.messages import ToolCall
from parley.tools import FunctionTool

ECHO_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
    "additionalProperties": False,
}


class Recorder:
    """A tool's function that counts its runs."""

    def __init__(self, output: Any = "ok") -> None:
        self.runs = 0
        self.output = output

    def __call__(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        self.runs += 1
        if isinstance(self.output, Exception):
            raise self.output
        return self.output


class Approver:
    def __init__(self, answer: bool | Exception = True, then: Any = None) -> None:
        self.answer, self.then = answer, then
        self.asked: list[ApprovalRequest] = []

    def approve(self, request: ApprovalRequest) -> bool:
        self.asked.append(request)
        if self.then is not None:
            self.then()
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class BrokenPolicy:
    def check(self, tool: str, accesses: Sequence[Access], root: str) -> Refusal | None:
        raise RuntimeError("no rules file")


def runner(
    tmp_path: Path,
    function: Recorder,
    *,
    policy: Any = None,
    approver: Any = None,
    holding: Any = lambda: True,
    limit: int = 1000,
) -> tuple[ToolRunner, LocalCoordinator]:
    coordinator = LocalCoordinator()
    tool = FunctionTool(
        name="echo",
        description="d",
        parameters=ECHO_SCHEMA,
        function=function,
        access=lambda args: [Access(mode="read", path=args["path"])],
    )
    context = ToolContext(root=str(tmp_path), session_id="s", turn_id="t")
    return (
        ToolRunner(
            tools={"echo": tool},
            policy=policy or parley.Policy(deny_read=["secrets/**"]),
            approver=approver or Approver(),
            context=context,
            emitter=Emitter("t", 1, coordinator),
            holding=holding,
            output_limit=limit,
        ),
        coordinator,
    )


def call(arguments: str = '{"path": "a.txt"}', name: str = "echo") -> ToolCall:
    return ToolCall(id="c1", name=name, arguments=arguments)


def kinds(coordinator: LocalCoordinator) -> list[EventKind]:
    return [e.kind for e in coordinator.read_events("t", 0, timeout=0)]


def test_an_allowed_call_runs_once_and_is_announced_with_its_result(tmp_path: Path) -> None:
    function = Recorder("contents")
    tools, coordinator = runner(tmp_path, function)
    result = tools.run(call(), step=2)
    assert (result.content, result.is_error, function.runs) == ("contents", False, 1)
    events = coordinator.read_events("t", 0, timeout=0)
    assert [e.kind for e in events] == [EventKind.TOOL_CALL, EventKind.TOOL_RESULT]
    assert events[0].data == {
        "step": 2,
        "call_id": "c1",
        "name": "echo",
        "arguments": '{"path": "a.txt"}',
    }


@pytest.mark.parametrize(
    ("the_call", "expected"),
    [
        (call(name="nope"), "error: unknown tool 'nope'; available: ['echo']"),
        (call('{"path": 3}'), "error: InvalidRequest:"),
        (call("not json"), "error: InvalidRequest:"),
    ],
)
def test_a_call_that_cannot_run_is_an_error_result_and_runs_nothing(
    tmp_path: Path, the_call: ToolCall, expected: str
) -> None:
    function = Recorder()
    tools, _coordinator = runner(tmp_path, function)
    result = tools.run(the_call, step=0)
    assert result.is_error and result.content.startswith(expected) and function.runs == 0


def test_a_policy_refusal_names_its_rule_and_the_approver_is_not_asked(tmp_path: Path) -> None:
    function, approver = Recorder(), Approver()
    tools, coordinator = runner(tmp_path, function, approver=approver)
    result = tools.run(call('{"path": "secrets/key"}'), step=0)
    assert result.refusal == "deny_read:secrets/**"
    assert result.content.startswith("refused by policy rule deny_read:secrets/**")
    assert function.runs == 0 and approver.asked == []
    assert kinds(coordinator) == [EventKind.TOOL_CALL, EventKind.REFUSAL, EventKind.TOOL_RESULT]


@pytest.mark.parametrize(
    ("policy", "approver", "rule"),
    [
        (BrokenPolicy(), None, "policy_error"),  # a policy that cannot decide refuses
        (None, Approver(False), "approver"),
        (None, Approver(RuntimeError("down")), "approver"),  # an approver that fails declines
    ],
)
def test_a_call_nobody_allowed_is_refused(
    tmp_path: Path, policy: Any, approver: Any, rule: str
) -> None:
    function = Recorder()
    tools, _coordinator = runner(tmp_path, function, policy=policy, approver=approver)
    result = tools.run(call(), step=0)
    assert result.refusal == rule and result.is_error and function.runs == 0


def test_the_approver_sees_the_parsed_call_and_its_accesses(tmp_path: Path) -> None:
    approver = Approver()
    tools, _coordinator = runner(tmp_path, Recorder(), approver=approver)
    tools.run(call(), step=0)
    (request,) = approver.asked
    assert (request.session_id, request.turn_id, request.tool) == ("s", "t", "echo")
    assert request.arguments == {"path": "a.txt"}
    assert request.accesses == (Access(mode="read", path="a.txt"),)


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (RuntimeError("disk full"), "error: RuntimeError: disk full"),
        (42, "error: the tool returned int, not text"),
    ],
)
def test_a_tool_that_fails_is_an_error_result(tmp_path: Path, output: Any, expected: str) -> None:
    tools, _coordinator = runner(tmp_path, Recorder(output))
    result = tools.run(call(), step=0)
    assert result.is_error and result.content == expected


def test_long_output_is_capped_and_the_model_is_told(tmp_path: Path) -> None:
    tools, _coordinator = runner(tmp_path, Recorder("x" * 50), limit=10)
    result = tools.run(call(), step=0)
    assert result.content == cap("x" * 50, 10) and result.content.startswith("x" * 10 + "\n")
    assert "50 characters, showing the first 10" in result.content


def test_a_lock_lost_before_the_call_or_during_the_approver_runs_nothing(tmp_path: Path) -> None:
    function = Recorder()
    tools, coordinator = runner(tmp_path, function, holding=lambda: False)
    with pytest.raises(Fenced, match="before a tool call"):
        tools.run(call(), step=0)
    assert kinds(coordinator) == []

    held = [True]
    slow = Approver(then=lambda: held.__setitem__(0, False))  # lost while a person decides
    tools, coordinator = runner(tmp_path, function, approver=slow, holding=lambda: held[0])
    with pytest.raises(Fenced, match="before a tool call"):  # the announcement, after judging
        tools.run(call(), step=0)
    assert function.runs == 0


def test_every_call_of_a_step_gets_a_distinct_id() -> None:
    calls = [ToolCall(id="", name="a", arguments="{}"), ToolCall(id="x", name="b", arguments="{}")]
    calls.append(ToolCall(id="x", name="c", arguments="{}"))
    assert [c.id for c in unique_ids(calls, 3)] == ["call_3_0", "x", "x_2"]


def test_an_approved_call_an_earlier_attempt_started_is_never_said_not_run_on_an_interrupt(
    tmp_path: Path,
) -> None:
    """The turn was interrupted after an earlier attempt started (and perhaps ran) the
    approved call: its result says its effect is unknown, not that it never ran; one no
    attempt started is marked started and then not run."""
    function = Recorder()
    tools, _coordinator = runner(tmp_path, function)
    asked = Judgement(
        call=call(), ask=Ask(rule="ask_tools", reason="a person decides"), approval_id="a1"
    )
    started = Answer(approved=True, consume=lambda: False)
    result = tools.answer(asked, 0, answer=started, interrupted=True)
    assert "effect is unknown" in result.content and result.is_error
    consumed: list[str] = []

    def consume() -> bool:
        consumed.append("a1")
        return True

    result = tools.answer(asked, 0, answer=Answer(approved=True, consume=consume), interrupted=True)
    assert result.content == NOT_RUN_INTERRUPTED and consumed == ["a1"]
    assert function.runs == 0
