"""The host context of a turn (docs/host.md#1-host-context): a JSON object the submission
carries, stored with the run, reaching the tools and the model request on whichever
process runs the turn, never the conversation; a resume keeps it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.errors import InvalidRequest
from parley.schemas.events import EventKind
from parley.schemas.messages import AssistantMessage
from tests.acceptance.conftest import ClientFactory
from tests.support.chaos import chaos_fleet
from tests.support.deployments import ALL, on_deployments
from tests.support.helpers import Control, scripted_host

pytestmark = on_deployments(*ALL)

WHO = {
    "when": "who",
    "steps": [{"tool_calls": [{"name": "whoami"}]}, {"text": "you are who you say"}],
}
GATED = {
    "when": "gated",
    "steps": [
        {"tool_calls": [{"name": "wait_for_gate"}]},
        {"tool_calls": [{"name": "whoami"}]},
        {"text": "done"},
    ],
}
CONTEXT = {"user": "ada", "tenant": "acme", "request": {"ip": "10.0.0.7", "tags": ["a", "b"]}}


def test_the_host_context_reaches_the_tools_and_the_model_but_not_the_conversation(
    make_client: ClientFactory, workspace: Path, control: Control
) -> None:
    client = make_client([WHO])
    session = client.open_session(workspace)
    handle = session.submit("who am I?", context=CONTEXT)
    result = handle.wait(timeout=30)
    assert result.reply == "you are who you say"
    [answer] = [e for e in handle.events() if e.kind is EventKind.TOOL_RESULT]
    assert json.loads(answer.data["content"]) == CONTEXT
    requests = control.requests()
    assert [r["host_context"] for r in requests] == [CONTEXT, CONTEXT]
    for request in requests:  # never as conversation (but for what the tool answered)
        said = [m for m in request["messages"] if m["role"] != "tool"]
        assert "ada" not in json.dumps(said)
    # The next turn carries its own (none), not the previous one's.
    session.turn("who am I now?")
    assert control.requests()[-1]["host_context"] == {}


def test_a_resume_keeps_the_host_context(
    make_client: ClientFactory, workspace: Path, control: Control
) -> None:
    client = make_client([GATED])
    session = client.open_session(workspace)
    handle = session.submit("gated work", context=CONTEXT)
    control.wait_entered()
    handle.interrupt()
    control.open_gate()
    assert handle.wait(timeout=30).outcome is parley.TurnStatus.CANCELLED
    resumed = session.resume(handle.turn_id)
    assert resumed.wait(timeout=30).reply == "done"
    assert all(r["host_context"] == CONTEXT for r in control.requests())
    whoami = [e for e in resumed.events() if e.kind is EventKind.TOOL_RESULT][-1]
    assert json.loads(whoami.data["content"]) == CONTEXT


@pytest.mark.parametrize(
    "context",
    [["not", "an", "object"], {"n": float("nan")}, {1: "int key"}, {"big": "x" * 70_000}, "s"],
)
def test_a_context_that_is_not_a_small_json_object_is_refused_and_stores_nothing(
    make_client: ClientFactory, workspace: Path, context: Any
) -> None:
    client = make_client([WHO])
    session = client.open_session(workspace)
    with pytest.raises(InvalidRequest, match="context"):
        session.submit("who am I?", context=context)
    assert session.tree() == []


@pytest.mark.embedded_only
def test_before_turn_and_after_commit_see_the_options_and_the_context(
    tmp_path: Path, workspace: Path
) -> None:
    seen: dict[str, Any] = {}

    class Hooks(parley.SessionHooks):
        def before_turn(
            self,
            request: parley.TurnRequest,
            options: parley.TurnOptions,
            state: parley.SessionStateView,
        ) -> None:
            seen["options"] = options
            seen["cancelled"] = options.cancelled()

        def after_commit(self, receipt: parley.CommitReceipt) -> None:
            seen["receipt"] = receipt

    host = scripted_host([{"when": ".*", "steps": [{"text": "ok"}]}], hooks=Hooks())
    with parley.connect(f"sqlite:///{tmp_path / 'p.db'}", host=host) as client:
        session = client.open_session(workspace)
        result = session.turn("hi", request_id="req-7", context=CONTEXT)
    options = seen["options"]
    assert (options.request_id, options.session_id, options.turn_id) == (
        "req-7",
        session.id,
        result.turn_id,
    )
    assert (options.attempt, options.resume, options.streaming) == (1, None, True)
    assert options.host_context == CONTEXT and options["attempt"] == 1
    assert seen["cancelled"] is False
    receipt = seen["receipt"]
    assert receipt.host_context == CONTEXT and receipt.options == options
    # The transcript path (root → this turn) and the rows the turn appended.
    assert receipt.path == (result.turn_id,)
    assert [row.kind for row in receipt.delta] == ["prompt", "assistant"]
    last = parley.transcript.to_messages(list(receipt.delta))[-1]
    assert isinstance(last, AssistantMessage) and last.text == "ok"
    with parley.connect(f"sqlite:///{tmp_path / 'p.db'}", host=host) as client:
        again = client.session(session.id).turn("and again")
    assert seen["receipt"].path == (result.turn_id, again.turn_id)
    assert seen["receipt"].delta[0].text == "and again"


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_host_context_survives_a_worker_killed_mid_turn(workspace: Path) -> None:
    """SIGKILL of the worker inside the turn's first tool: the worker that takes the turn
    over reads the context from the run row, so its tool and model see the same one."""
    with chaos_fleet(workspace, pool="threads") as chaos:
        chaos.control.script([GATED])
        handle = chaos.client.open_session(workspace).submit("gated work", context=CONTEXT)
        chaos.control.wait_entered()
        victim = chaos.driver_pid(handle.turn_id)
        os.killpg(chaos.worker_group_of(victim), signal.SIGKILL)
        chaos.control.open_gate()
        result = handle.wait(60)
        assert result.reply == "done"
        assert chaos.driver_pid(handle.turn_id) != victim
        whoami = [e for e in handle.events() if e.kind is EventKind.TOOL_RESULT][-1]
        assert json.loads(whoami.data["content"]) == CONTEXT
        assert all(r["host_context"] == CONTEXT for r in chaos.control.requests())
