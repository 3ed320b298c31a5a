"""Durable approvals (docs/guarantees.md#15-approvals, docs/approvals.md), through the public
client, on every back end: a call that asks waits for a person holding no driver, runs once per
approval, and every waiting call ends with a result, so the replay never holds an orphan tool
call."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import Conflict, InvalidRequest, SessionBusy, WaitTimeout
from parley.schemas.events import EventKind
from parley.schemas.records import Decision, TurnStatus
from tests.acceptance.conftest import ClientFactory
from tests.support.deployments import ALL, on_deployments
from tests.support.helpers import Control, scripted_host
from tests.support.waiting import wait_until

pytestmark = on_deployments(*ALL)

ASK = {"ask_tools": ["record_call"]}


def record(note: str) -> dict[str, Any]:
    return {"name": "record_call", "arguments": {"note": note}}


PUSH = {
    "when": "push",
    "steps": [
        {"text": "Recording. ", "tool_calls": [record("one")]},
        {"text": "done: {last_message}"},
    ],
}
TWO = {
    "when": "two",
    "steps": [{"tool_calls": [record("first"), record("second")]}, {"text": "both answered"}],
}
ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}


def wait_for(handle: parley.TurnHandle, status: TurnStatus, timeout: float = 30) -> None:
    wait_until(lambda: handle.record().status is status, timeout, what=f"{handle} to be {status}")


def waiting(client: parley.Client, workspace: Path, prompt: str) -> parley.TurnHandle:
    session = client.open_session(workspace)
    handle = session.submit(prompt)
    wait_for(handle, TurnStatus.WAITING)
    return handle


def tool_results(control: Control) -> list[dict[str, Any]]:
    """The tool messages of the model's last request."""
    return [m for m in control.requests()[-1]["messages"] if m["role"] == "tool"]


@pytest.mark.also_amqp
def test_an_approved_call_runs_once_after_its_answer(
    make_client: ClientFactory, workspace: Path, control: Control
) -> None:
    client = make_client([PUSH, ECHO], policy=ASK)
    handle = waiting(client, workspace, "push it")
    assert control.recorded_calls() == []  # nothing of the step ran while it waits
    [pending] = handle.approvals()
    assert (pending.tool, pending.arguments, pending.decision) == (
        "record_call",
        {"note": "one"},
        None,
    )
    assert handle.result() is None
    with pytest.raises(WaitTimeout):
        handle.wait(timeout=0.5)  # waiting is not an end

    approved = handle.approve(pending.approval_id)
    assert approved.decision is Decision.APPROVED
    result = handle.wait(timeout=30)
    assert result.outcome is TurnStatus.FINISHED
    assert result.reply == "done: push it"
    assert len(control.recorded_calls()) == 1
    assert [(a.approval_id, a.decision) for a in result.approvals] == [
        (pending.approval_id, Decision.APPROVED)
    ]
    events = list(handle.events())
    kinds = [e.kind for e in events]
    asked = kinds.index(EventKind.APPROVAL_REQUESTED)
    assert kinds.index(EventKind.APPROVAL_ANSWERED) > asked
    assert kinds.index(EventKind.TOOL_CALL) > kinds.index(EventKind.APPROVAL_ANSWERED)
    assert events[asked].data["approval_id"] == pending.approval_id
    assert events[-1].data["approvals"] == [
        {
            "approval_id": pending.approval_id,
            "tool": "record_call",
            "decision": "approved",
            "reason": None,
        }
    ]
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))
    assert handle.approvals() == []


def test_a_denied_call_tells_the_model_why_and_the_next_turn_replays_cleanly(
    make_client: ClientFactory, workspace: Path, control: Control
) -> None:
    client = make_client([PUSH, ECHO], policy=ASK)
    handle = waiting(client, workspace, "push it")
    [pending] = handle.approvals()
    handle.deny(pending.approval_id, reason="not on a Friday")
    result = handle.wait(timeout=30)
    assert result.outcome is TurnStatus.FINISHED
    assert control.recorded_calls() == []
    [answer] = tool_results(control)
    assert "denied" in answer["content"] and "not on a Friday" in answer["content"]
    refusals = [e for e in handle.events() if e.kind is EventKind.REFUSAL]
    assert refusals and refusals[0].data["rule"] == "approval"

    session = client.session(handle.session_id)
    after = session.turn("and now?")
    assert after.reply == "heard: and now?"
    assert [m["role"] for m in control.requests()[-1]["messages"]].count("tool") == 1


def test_two_calls_of_one_step_one_approved_one_denied(
    make_client: ClientFactory, workspace: Path, control: Control
) -> None:
    client = make_client([TWO, ECHO], policy=ASK)
    handle = waiting(client, workspace, "two things")
    first, second = handle.approvals()
    assert (first.arguments["note"], second.arguments["note"]) == ("first", "second")
    handle.approve(first.approval_id)
    assert handle.record().status is TurnStatus.WAITING  # one answer is not all of them
    assert handle.record().waiting_for == "approval"  # what it waits for (docs/http.md#3-resources)
    assert control.recorded_calls() == []
    handle.deny(second.approval_id)
    result = handle.wait(timeout=30)
    assert result.reply == "both answered"
    assert len(control.recorded_calls()) == 1
    contents = [m["content"] for m in tool_results(control)]
    assert contents[0] == "recorded" and "denied" in contents[1]


def test_an_interrupt_while_waiting_cancels_and_leaves_no_orphan_call(
    make_client: ClientFactory, workspace: Path, control: Control
) -> None:
    client = make_client([TWO, ECHO], policy=ASK)
    handle = waiting(client, workspace, "two things")
    handle.interrupt()
    result = handle.wait(timeout=30)
    assert result.outcome is TurnStatus.CANCELLED
    assert control.recorded_calls() == []
    assert {(a.decision, a.reason) for a in result.approvals} == {(Decision.DENIED, "interrupted")}
    results = [e for e in handle.events() if e.kind is EventKind.TOOL_RESULT]
    assert len(results) == 2 and all(e.data["is_error"] for e in results)

    session = client.session(handle.session_id)
    after = session.turn("next")
    assert after.outcome is TurnStatus.FINISHED
    # The cancelled turn's step replays whole: two calls, two results.
    roles = [m["role"] for m in control.requests()[-1]["messages"]]
    assert roles.count("tool") == 2


def test_a_second_answer_is_a_conflict_naming_the_first(
    make_client: ClientFactory, workspace: Path
) -> None:
    client = make_client([TWO, PUSH, ECHO], policy=ASK)
    handle = waiting(client, workspace, "two things")
    first, second = handle.approvals()
    handle.deny(first.approval_id, reason="no")
    with pytest.raises(Conflict, match=r"denied.*'no'"):
        handle.approve(first.approval_id)
    with pytest.raises(InvalidRequest):
        handle.approve("no-such-approval")
    other = waiting(client, workspace, "push it")
    with pytest.raises(InvalidRequest):  # a call of another turn is not this turn's
        other.approve(second.approval_id)
    assert handle.record().status is TurnStatus.WAITING
    handle.approve(second.approval_id)
    assert handle.wait(timeout=30).outcome is TurnStatus.FINISHED


def test_steers_sent_while_waiting_reach_the_model_when_it_goes_on(
    make_client: ClientFactory, workspace: Path, control: Control
) -> None:
    client = make_client([PUSH, ECHO], policy=ASK)
    handle = waiting(client, workspace, "push it")
    handle.say("and mind the tests")
    [pending] = handle.approvals()
    handle.approve(pending.approval_id)
    result = handle.wait(timeout=30)
    assert result.reply == "done: and mind the tests"
    assert result.undelivered == ()


def test_a_waiting_turn_holds_its_sessions_line(
    make_client: ClientFactory, workspace: Path
) -> None:
    client = make_client([PUSH, ECHO], policy=ASK)
    handle = waiting(client, workspace, "push it")
    session = client.session(handle.session_id)
    with pytest.raises(SessionBusy):
        session.submit("later", if_busy="reject")
    later = session.submit("later")
    time.sleep(1.0)
    assert later.record().status is TurnStatus.QUEUED  # behind the waiting turn
    [pending] = handle.approvals()
    handle.approve(pending.approval_id)
    assert later.wait(timeout=30).reply == "heard: later"
    assert [t.prompt for t in session.history()] == ["push it", "later"]


@pytest.mark.embedded_only
def test_an_unanswered_call_times_out_as_a_denial(tmp_path: Path, workspace: Path) -> None:
    host = scripted_host(
        [PUSH, ECHO],
        tools=[*parley.tools.WORKSPACE_TOOLS, parley.tool(name="record_call")(_note)],
        policy=parley.Policy(ask_tools=["record_call"]),
        approval_timeout=1.0,
    )
    with parley.connect(f"sqlite:///{tmp_path / 'p.db'}", host=host) as client:
        handle = client.open_session(workspace).submit("push it")
        result = handle.wait(timeout=30)
    assert result.outcome is TurnStatus.FINISHED
    [approval] = result.approvals
    assert (approval.decision, approval.reason) == (Decision.DENIED, "timed out")
    assert approval.expires_at is not None


def _note(note: str) -> str:
    """Records a note.

    Args:
        note: what to record.
    """
    return json.dumps({"noted": note})
