"""Sub-agents (docs/sub-agents.md) through the public client, on every back end: an agent
call is a child turn in a child session, opened once per call; the parent's step waits
holding nothing (``waiting`` for agents) and goes on with each child's reply once the
last child ended; children nest within the host's depth bound, and a call past it is
a tool error the model hears, not a turn."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import parley
from parley.schemas.events import EventKind
from parley.schemas.records import TurnStatus, Waiting
from tests.acceptance.conftest import deployed_client, host_fleet
from tests.support.deployments import ALL, on_deployments
from tests.support.helpers import Control
from tests.support.hosts import agents_host
from tests.support.waiting import wait_until

pytestmark = on_deployments(*ALL)

agents_fleet = host_fleet("tests.support.hosts:agents_host")


def call(agent: str, task: str) -> dict[str, Any]:
    return {"name": agent, "arguments": {"task": task}}


FAN_OUT = {
    "when": "^fan out",
    "steps": [
        {
            "text": "Asking three. ",
            "tool_calls": [
                call("researcher", "topic alpha"),
                call("researcher", "topic beta"),
                call("researcher", "topic gamma"),
            ],
        },
        {"text": "all three reported"},
    ],
}
TOPIC = {"when": "^topic", "steps": [{"text": "found {prompt}"}]}
NEST = {
    "when": "^nest",
    "steps": [{"tool_calls": [call("researcher", "review the draft")]}, {"text": "nested done"}],
}
REVIEW = {
    "when": "^review",
    "steps": [{"tool_calls": [call("critic", "check the draft")]}, {"text": "critic answered"}],
}
CHECK = {
    "when": "^check",
    "steps": [{"tool_calls": [call("pedant", "nitpick the draft")]}, {"text": "checked"}],
}
ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
RULES: list[dict[str, Any]] = [FAN_OUT, TOPIC, NEST, REVIEW, CHECK, ECHO]


@pytest.fixture
def client(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[parley.Client]:
    """A client of the deployment under test whose host declares the agents."""
    with deployed_client(
        backend, request, tmp_path, fleet="agents_fleet", host=agents_host
    ) as deployed:
        yield deployed


def tool_messages(control: Control, turn_id: str) -> list[dict[str, Any]]:
    """The tool results the model was shown in the last request of ``turn_id``."""
    requests = [r for r in control.requests() if r["turn_id"] == turn_id]
    return [m for m in requests[-1]["messages"] if m["role"] == "tool"]


def test_a_call_is_a_child_turn_and_the_parent_goes_on_with_each_reply(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    result = session.turn("fan out over three topics", timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "all three reported"
    assert result.steps == 2
    shown = tool_messages(control, result.turn_id)
    assert [(m["name"], m["content"], m["is_error"]) for m in shown] == [
        ("researcher", "found topic alpha", False),
        ("researcher", "found topic beta", False),
        ("researcher", "found topic gamma", False),
    ]
    children = client.store.children_of_step(result.run_id, 0)
    assert len(children) == 3  # one child per call
    assert [(c.step, c.call_id, c.agent, c.turn_id, c.status) for c in result.children] == [
        (0, call_id, "researcher", children[call_id].turn_id, TurnStatus.FINISHED)
        for call_id in ("call_0_0", "call_0_1", "call_0_2")
    ]
    for child in children.values():
        assert child.status is TurnStatus.FINISHED
        assert child.agent == "researcher"
        opened = client.session(child.session_id)
        assert opened.parent_turn_id == result.turn_id
        assert opened.parent_call_id == child.call_id
        assert opened.agent == "researcher"
        assert opened.root == str(workspace)  # the parent's root: files land in one tree
        assert client.attach(child.turn_id).wait(timeout=5).reply == child.reply
    # The child saw the task as its prompt, and nothing of the parent's conversation.
    child_request = next(
        r for r in control.requests() if r["turn_id"] == children[shown[0]["call_id"]].turn_id
    )
    assert [m["text"] for m in child_request["messages"] if m["role"] == "user"] == ["topic alpha"]
    assert "researcher" not in child_request["tools"]  # it calls agents of its own only
    assert "critic" in child_request["tools"]
    # The parent's own stream tells of each child: its start, with the hold, and its end.
    events = client.store.events_after(result.turn_id, 0)
    started = [e.data for e in events if e.kind is EventKind.AGENT_STARTED]
    assert started == [
        {
            "call_id": c.call_id,
            "agent": "researcher",
            "turn_id": c.turn_id,
            "session_id": c.session_id,
        }
        for c in result.children
    ]
    ended = [e.data for e in events if e.kind is EventKind.AGENT_ENDED]
    assert sorted(e["call_id"] for e in ended) == ["call_0_0", "call_0_1", "call_0_2"]
    assert {e["outcome"] for e in ended} == {"finished"}
    kinds = [e.kind for e in events]
    last_ended = max(i for i, k in enumerate(kinds) if k is EventKind.AGENT_ENDED)
    assert kinds.index(EventKind.TOOL_RESULT) > last_ended  # results once all ended
    assert (session.parent_turn_id, session.parent_call_id, session.agent) == (None, None, None)
    assert session.turn("and now?", timeout=30).reply == "heard: and now?"


def test_children_nest_within_the_depth_bound(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    session = client.open_session(workspace)
    result = session.turn("nest two deep", timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    [researcher] = client.store.children_of_step(result.run_id, 0).values()
    assert researcher.reply == "critic answered"
    researcher_run = client.attach(researcher.turn_id).wait(timeout=5).run_id
    [critic] = client.store.children_of_step(researcher_run, 0).values()
    assert critic.agent == "researcher/critic"
    assert critic.reply == "checked"
    # The critic is at depth 2, the bound: its call of the pedant is a tool error.
    [refused] = tool_messages(control, critic.turn_id)
    assert refused["is_error"] is True
    assert "max_agent_depth" in refused["content"]
    assert tool_messages(control, result.turn_id)[0]["content"] == "critic answered"
    critic_run = client.attach(critic.turn_id).wait(timeout=5).run_id
    assert client.store.children_of_step(critic_run, 0) == {}


def test_a_parent_waits_for_its_children_holding_nothing(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    gated = {
        "when": "^topic",
        "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "found {prompt}"}],
    }
    control.script([FAN_OUT, gated, ECHO])
    session = client.open_session(workspace)
    handle = session.submit("fan out while gated")
    control.wait_entered(timeout=60)
    record = handle.record()
    assert record.status is TurnStatus.WAITING
    assert record.waiting_for is Waiting.AGENTS
    control.open_gate()
    result = handle.wait(timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert [m["content"] for m in tool_messages(control, result.turn_id)] == [
        "found topic alpha",
        "found topic beta",
        "found topic gamma",
    ]


def test_a_turns_usage_total_counts_its_descendants(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    result = client.open_session(workspace).turn("nest two deep", timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    [researcher] = result.children
    researcher_result = client.attach(researcher.turn_id).wait(timeout=5)
    [critic] = researcher_result.children
    critic_result = client.attach(critic.turn_id).wait(timeout=5)
    assert critic_result.children == ()

    def own(turn: parley.TurnResult) -> int:
        return turn.usage.input_tokens + turn.usage.output_tokens

    mine, researchers, critics = own(result), own(researcher_result), own(critic_result)
    assert min(mine, researchers, critics) > 0
    assert critic_result.usage.total == critics  # no children: its own
    assert researcher_result.usage.total == researchers + critics
    assert result.usage.total == mine + researchers + critics
    # Its own tokens stay its own (what its budgets count); the tree's are beside them.
    assert isinstance(result.usage, parley.TurnUsage)
    assert result.usage.input_tokens == client.store.run_state(result.turn_id).usage.input_tokens
    tree = result.usage.tree
    assert tree.input_tokens == sum(
        r.usage.input_tokens for r in (result, researcher_result, critic_result)
    )
    assert tree.total == result.usage.total


def test_a_batch_lines_children_count_in_its_progress(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    gated = {
        "when": "^topic",
        "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "found {prompt}"}],
    }
    control.script([FAN_OUT, gated, ECHO])
    line = {"method": "POST", "url": "/v1/responses", "body": {"input": "fan out, batched"}}
    batch = client.submit_batch([{"custom_id": "c0", **line}], root=workspace)
    wait_until(lambda: control.gate_calls >= 2, 60, what="children at the gate")
    counts = batch.status().counts
    # The line is in progress, running in its children, not waiting for a person; its
    # three children count as turns beside it, and it is not complete before they end.
    assert (counts.running, counts.waiting, counts.queued) == (1, 0, 0)
    assert counts.awaiting_agents == 1  # no driver holds it: its children run
    assert counts.agents_running >= 2
    assert counts.agents_running + counts.agents_waiting == 3
    assert batch.status().request_counts == {"total": 1, "completed": 0, "failed": 0}
    shown = subprocess.run(
        [sys.executable, "-m", "parley", "batch", "status", batch.id],
        env={**os.environ, "PARLEY_DATABASE_URL": client.store.engine.url.render_as_string()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown
    assert re.search(r"child turns of the lines' agents: [23] running, [01] waiting", shown.stdout)
    control.open_gate()
    wait_until(lambda: batch.status().ended, 60, what="the batch to end")
    state = batch.status()
    assert state.request_counts == {"total": 1, "completed": 1, "failed": 0}
    assert (state.counts.agents_running, state.counts.agents_waiting) == (0, 0)
    [row] = batch.output()
    assert row["response"]["body"]["output_text"] == "all three reported"


ONE = {
    "when": "^one",
    "steps": [{"tool_calls": [call("researcher", "slow topic")]}, {"text": "went on"}],
}
SLOW = {
    "when": "^slow",
    "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "slow done"}],
}


def child_inside_the_gate(
    client: parley.Client, control: Control, workspace: Path
) -> tuple[parley.TurnHandle, str]:
    """A parent whose one child waits at the gate, inside its tool: the parent's handle
    and the child's turn id."""
    control.script([ONE, SLOW, ECHO])
    handle = client.open_session(workspace).submit("one child")
    control.wait_entered(timeout=60)
    [child] = client.store.children_of_step(handle.record().run_id, 0).values()
    return handle, child.turn_id


def test_an_interrupted_child_gives_its_parent_a_cancelled_result(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    handle, child_turn = child_inside_the_gate(client, control, workspace)
    client.attach(child_turn).interrupt()
    control.open_gate()
    assert client.attach(child_turn).wait(timeout=60).outcome is TurnStatus.CANCELLED
    result = handle.wait(timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "went on"
    [shown] = tool_messages(control, result.turn_id)
    assert (shown["content"], shown["is_error"]) == ("cancelled", True)


def test_interrupting_the_parent_reaches_its_children(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    handle, child_turn = child_inside_the_gate(client, control, workspace)
    handle.interrupt()
    control.open_gate()
    assert handle.wait(timeout=60).outcome is TurnStatus.CANCELLED
    assert client.attach(child_turn).wait(timeout=5).outcome is TurnStatus.CANCELLED


TWO = {
    "when": "^two",
    "steps": [
        {"tool_calls": [call("researcher", "topic alpha"), call("researcher", "slow topic")]},
        {"text": "both reported"},
    ],
}


def test_resuming_an_interrupted_parent_resumes_its_cancelled_children(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script([TWO, TOPIC, SLOW, ECHO])
    session = client.open_session(workspace)
    handle = session.submit("two children, one slow")
    control.wait_entered(timeout=60)
    children = client.store.children_of_step(handle.record().run_id, 0)
    fast, slow = children["call_0_0"], children["call_0_1"]
    assert client.attach(fast.turn_id).wait(timeout=60).reply == "found topic alpha"
    handle.interrupt()
    control.open_gate()
    assert handle.wait(timeout=60).outcome is TurnStatus.CANCELLED
    assert client.attach(slow.turn_id).wait(timeout=5).outcome is TurnStatus.CANCELLED
    assert client.store.steps_of(handle.turn_id) == []  # the held step stays held
    before = list(handle.events(children=True))  # the tree's stream, to its end

    resumed = session.resume(handle.turn_id)
    result = resumed.wait(timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "both reported"
    # The finished child kept its result and ran once; the cancelled one went on from
    # its last step, as its own resume, and the parent heard its new reply.
    assert [m["content"] for m in tool_messages(control, result.turn_id)] == [
        "found topic alpha",
        "slow done",
    ]
    assert [r["turn_id"] for r in control.requests()].count(fast.turn_id) == 1
    assert client.attach(slow.turn_id).wait(timeout=5).reply == "slow done"
    ended = [
        (e.data["call_id"], e.data["outcome"])
        for e in resumed.events()
        if e.kind is EventKind.AGENT_ENDED
    ]
    assert ended == [("call_0_0", "finished"), ("call_0_1", "cancelled"), ("call_0_1", "finished")]
    # The tree's stream resumed from where it ended goes on with the resumed tree: the
    # parent's and the resumed child's new events, each once; nothing of the finished one.
    after = list(resumed.events(children=True, after=before[-1].cursor))
    keys = [(e.turn_id, e.seq) for e in after]
    assert len(keys) == len(set(keys)) and not set(keys) & {(e.turn_id, e.seq) for e in before}
    assert {e.turn_id for e in after} == {handle.turn_id, slow.turn_id}
    assert [e.data["outcome"] for e in after if e.kind is EventKind.END] == [
        "finished",
        "finished",
    ]
    assert {tuple(p["turn_id"] for p in e.path) for e in after} == {(), (slow.turn_id,)}


def test_resuming_an_interrupted_parent_resumes_its_cancelled_grandchildren(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    gated_check = {
        "when": "^check",
        "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "checked"}],
    }
    control.script([NEST, REVIEW, gated_check, ECHO])
    session = client.open_session(workspace)
    handle = session.submit("nest, interrupted at the bottom")
    control.wait_entered(timeout=60)
    [researcher] = client.store.children_of_step(handle.record().run_id, 0).values()
    researcher_run = client.attach(researcher.turn_id).record().run_id
    [critic] = client.store.children_of_step(researcher_run, 0).values()
    handle.interrupt()  # reaches the researcher, then the critic
    control.open_gate()
    assert handle.wait(timeout=60).outcome is TurnStatus.CANCELLED
    for turn in (researcher.turn_id, critic.turn_id):
        assert client.attach(turn).wait(timeout=5).outcome is TurnStatus.CANCELLED

    result = session.resume(handle.turn_id).wait(timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "nested done"
    assert client.attach(researcher.turn_id).wait(timeout=5).reply == "critic answered"
    assert client.attach(critic.turn_id).wait(timeout=5).reply == "checked"
    assert control.gate_calls == 1  # the critic went on from its committed step


LONG = {
    "when": "^long",
    # Step after step, each streamed slowly and calling a tool, until stopped.
    "steps": [
        {
            "text": "working on it",
            "chunk_chars": 2,
            "delay_ms": 20,
            "tool_calls": [{"name": "record_call", "arguments": {}}],
        }
    ],
}
TREE = {
    "when": "^tree",
    "steps": [
        {"tool_calls": [call("researcher", "long part one"), call("researcher", "long part two")]},
        {"text": "never heard"},
    ],
}


def test_interrupting_the_parent_ends_the_tree_within_one_step_of_each_child(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script([TREE, LONG, ECHO])
    session = client.open_session(workspace)
    handle = session.submit("tree of long work", contract=parley.TaskContract(max_steps=200))
    wait_until(lambda: handle.record().status is TurnStatus.WAITING, 60, what="the parent to wait")
    opened = client.store.children_of_step(handle.record().run_id, 0).values()
    children = [c.turn_id for c in opened]
    assert len(children) == 2

    def steps(turn_id: str) -> int:
        return len(client.store.steps_of(turn_id))

    wait_until(lambda: all(steps(c) >= 2 for c in children), 60, what="both children mid-run")
    handle.interrupt()  # accepted for the parent, then for each child, before it returns
    committed = {c: steps(c) for c in children}
    assert handle.wait(timeout=60).outcome is TurnStatus.CANCELLED
    for child in children:
        assert client.attach(child).wait(timeout=5).outcome is TurnStatus.CANCELLED
        # The step in flight when the interrupt came commits whole; none after it.
        assert committed[child] <= steps(child) <= committed[child] + 1


def test_a_policy_names_agents_like_tools(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    control.policy(deny_tools=["researcher"])
    session = client.open_session(workspace)
    result = session.turn("fan out, refused", timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    shown = tool_messages(control, result.turn_id)
    assert all("deny_tools:researcher" in m["content"] and m["is_error"] for m in shown)
    assert client.store.children_of_step(result.run_id, 0) == {}  # no child was opened


def test_an_agent_call_that_asks_opens_its_child_once_approved(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    control.policy(ask_tools=["researcher"])
    handle = client.open_session(workspace).submit("fan out, asking first")
    wait_until(lambda: handle.record().status is TurnStatus.WAITING, 60, what="the asks")
    pending = handle.approvals()
    assert [a.tool for a in pending] == ["researcher"] * 3
    assert client.store.children_of_step(handle.record().run_id, 0) == {}
    control.policy()  # the children's own calls ask nothing
    handle.deny(pending[0].approval_id, "not this one")
    for approval in pending[1:]:
        handle.approve(approval.approval_id)
    result = handle.wait(timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    shown = tool_messages(control, result.turn_id)
    assert "denied" in shown[0]["content"] and shown[0]["is_error"]
    assert [m["content"] for m in shown[1:]] == ["found topic beta", "found topic gamma"]
    assert len(client.store.children_of_step(result.run_id, 0)) == 2


@pytest.mark.embedded_only
def test_calls_past_max_parallel_agents_wait_for_a_place(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, workspace: Path, control: Control
) -> None:
    gated = {
        "when": "^topic",
        "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "found {prompt}"}],
    }
    control.script([FAN_OUT, gated, ECHO])

    def two_at_once() -> parley.Host:
        return agents_host(max_parallel_agents=2)

    with deployed_client(
        backend, request, tmp_path, fleet="agents_fleet", host=two_at_once
    ) as client:
        handle = client.open_session(workspace).submit("fan out, two at a time")
        wait_until(lambda: control.gate_calls == 2, 60, what="two children at the gate")
        children = client.store.children_of_step(handle.record().run_id, 0)
        third = children["call_0_2"]  # the model's last call waits for a place
        assert client.attach(third.turn_id).record().waiting_for is Waiting.AGENTS
        time.sleep(0.5)
        assert control.gate_calls == 2  # no third child runs while two do
        control.open_gate()
        result = handle.wait(timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert control.gate_calls == 3
    assert [m["content"] for m in tool_messages(control, result.turn_id)] == [
        "found topic alpha",
        "found topic beta",
        "found topic gamma",
    ]


def test_a_parent_lists_and_answers_its_descendants_approvals(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    asking_child = {
        "when": "^asks",
        "steps": [
            {"tool_calls": [{"name": "record_call", "arguments": {"note": "child"}}]},
            {"text": "child recorded"},
        ],
    }
    parent = {
        "when": "^delegate",
        "steps": [{"tool_calls": [call("researcher", "asks first")]}, {"text": "delegated"}],
    }
    control.script([parent, asking_child, ECHO])
    control.policy(ask_tools=["record_call"])
    handle = client.open_session(workspace).submit("delegate the asking")
    wait_until(lambda: handle.approvals(), 60, what="the child's call to ask")
    [pending] = handle.approvals()
    [child] = client.store.children_of_step(handle.record().run_id, 0).values()
    assert pending.turn_id == child.turn_id
    assert pending.path == (
        {"agent": "researcher", "call_id": "call_0_0", "turn_id": child.turn_id},
    )
    assert client.attach(child.turn_id).approvals()[0].path == ()  # its own, seen from it
    handle.approve(pending.approval_id)  # answered through the parent
    result = handle.wait(timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "delegated"
    assert control.recorded_notes() == ["child"]
    assert handle.approvals() == []


def test_one_stream_for_the_tree_resumes_from_any_cursor_exactly_once(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script(RULES)
    handle = client.open_session(workspace).submit("fan out over the tree")
    tree = list(handle.events(children=True))
    result = handle.wait(timeout=60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    keys = [(e.turn_id, e.seq) for e in tree]
    assert len(keys) == len(set(keys))  # each event once
    turns = {result.turn_id, *(c.turn_id for c in result.children)}
    assert {e.turn_id for e in tree} == turns
    for turn in turns:
        # Every durable event of every turn, in its own seq order.
        durable = [e.seq for e in tree if e.turn_id == turn and e.kind.durable]
        assert durable == [e.seq for e in client.store.events_after(turn, 0)]
    by_child = {c.turn_id: c for c in result.children}
    for event in tree:
        if event.turn_id == result.turn_id:
            assert event.path == ()
        else:
            child = by_child[event.turn_id]
            where = {"agent": "researcher", "call_id": child.call_id, "turn_id": child.turn_id}
            assert event.path == (where,)
    # Every turn's end came (a child's end may reach the stream after its parent's: each
    # turn's follower reads on its own).
    assert sorted(e.turn_id for e in tree if e.kind is EventKind.END) == sorted(turns)
    # Resumed half-way, then after the end: the rest, exactly once; then nothing.
    half = len(tree) // 2
    rest = list(handle.events(after=tree[half - 1].cursor, children=True))
    again = [(e.turn_id, e.seq) for e in rest]
    assert sorted(again) == sorted(keys[half:])  # the turns interleave as they come
    for turn in turns:
        assert [s for t, s in again if t == turn] == [s for t, s in keys[half:] if t == turn]
    assert list(handle.events(after=tree[-1].cursor, children=True)) == []
    with pytest.raises(parley.errors.InvalidRequest):
        list(handle.events(after="not a cursor", children=True))
