"""The driver seam (docs/drivers.md): a host's own loop, here the example
plan-then-act driver (``examples/plan_then_act``), runs its steps through parley's sink,
tools, policy and commit path, so streaming, steering, interrupts, budgets, display-only
partials and crash resume hold for it as for parley's own loop, embedded and on the fleet
(whose workers load the driver with their host)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import parley
from examples.plan_then_act.driver import ACTING, PLANNING
from parley.schemas.events import EventKind
from tests.acceptance.conftest import deployed_client, host_fleet
from tests.acceptance.test_approvals import wait_for
from tests.support.chaos import chaos_fleet
from tests.support.deployments import ALL, on_deployments
from tests.support.helpers import Control
from tests.support.hosts import plan_then_act_host

PLAN_HOST = "tests.support.hosts:plan_then_act_host"
PLANNED = {
    "when": "retry",
    "steps": [
        {"text": "1. read retry.py\n2. answer"},
        {"text": "reading", "tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
        {"text": "it backs off"},
    ],
}
GATED = {
    "when": "gated",
    "steps": [
        {"text": "1. wait\n2. answer"},
        {"tool_calls": [{"name": "wait_for_gate"}]},
        {"text": "heard: {last_message}"},
    ],
}
ENDLESS = {
    "when": "endless",
    "steps": [
        {"text": "1. read forever"},
        {"text": "still reading", "tool_calls": [{"name": "list_files"}]},
    ],
}


pytestmark = on_deployments(*ALL)
plan_fleet = host_fleet(PLAN_HOST)


@pytest.fixture
def client(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[parley.Client]:
    with deployed_client(
        backend, request, tmp_path, fleet="plan_fleet", host=plan_then_act_host
    ) as deployed:
        yield deployed


def labels(client: parley.Client, turn_id: str) -> list[str]:
    return [s.payload.label for s in client.store.steps_of(turn_id)]


@pytest.mark.postgres
def test_a_plan_then_act_turn_streams_every_step_and_commits_only_conversation(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script([PLANNED])
    (workspace / "a.txt").write_text("backoff = 2 ** attempt\n")
    session = client.open_session(workspace)
    handle = session.submit("what is the retry policy?")
    result = handle.wait(timeout=60)
    assert (result.outcome, result.reply, result.steps) == (
        parley.TurnStatus.FINISHED,
        "it backs off",
        3,
    )
    assert labels(client, handle.turn_id) == ["plan", "act", "act"]
    events = list(handle.events())
    assert {e.data["step"] for e in events if e.kind is EventKind.TOKEN} == {0, 1, 2}
    [read] = [e for e in events if e.kind is EventKind.TOOL_RESULT]
    assert read.data["content"] == "backoff = 2 ** attempt\n"

    plan, act, answer = control.requests()
    # The plan step offered no tools and carried the driver's instruction; the act steps
    # offered every tool and saw the plan with the instruction to carry it out.
    assert plan["tools"] == [] and control.user_texts(plan, "driver") == [PLANNING]
    assert "read_file" in act["tools"] and control.user_texts(act, "driver") == [ACTING]
    said = [m["text"] for m in answer["messages"] if m["role"] == "assistant"]
    assert said[0].startswith("1.")
    # The scaffolding was sent, never stored: the next turn replays the plan as the
    # model said it, but not the instructions.
    session.turn("retry again?", timeout=60)
    replayed = control.requests()[-3]  # the next turn's plan request
    assert control.user_texts(replayed, "driver") == [PLANNING]  # its own, once
    assert "1. read retry.py\n2. answer" in [m.get("text") for m in replayed["messages"]]
    rows = parley.transcript.to_messages(session.transcript())
    assert not any(getattr(m, "origin", "") == "driver" for m in rows)


@pytest.mark.postgres
def test_a_steer_reaches_the_driver_s_next_step(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script([GATED])
    handle = client.open_session(workspace).submit("gated work")
    control.wait_entered()
    handle.say("use the cache")
    control.open_gate()
    result = handle.wait(timeout=60)
    assert result.reply == "heard: use the cache"
    steps = client.store.steps_of(handle.turn_id)
    assert [s.payload.label for s in steps] == ["plan", "act", "act"]
    assert [i.text for i in steps[2].payload.inputs] == ["use the cache"]
    last = control.requests()[-1]
    assert control.user_texts(last)[-1] == "use the cache"  # after the driver's instruction


@pytest.mark.postgres
def test_an_interrupt_stops_a_driver_at_its_next_boundary(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script([GATED])
    handle = client.open_session(workspace).submit("gated work")
    control.wait_entered()
    handle.interrupt()
    control.open_gate()
    result = handle.wait(timeout=60)
    assert result.outcome is parley.TurnStatus.CANCELLED
    assert labels(client, handle.turn_id) == ["plan", "act"]
    assert len(control.requests()) == 2  # no model call after the interrupt


@pytest.mark.postgres
def test_a_budget_stops_a_driver(client: parley.Client, workspace: Path, control: Control) -> None:
    control.script([ENDLESS])
    handle = client.open_session(workspace).submit(
        "endless work", contract=parley.TaskContract(max_steps=2)
    )
    result = handle.wait(timeout=60)
    assert result.outcome is parley.TurnStatus.BUDGET_EXCEEDED
    assert labels(client, handle.turn_id) == ["plan", "act"]


@pytest.mark.postgres
def test_a_failing_driver_keeps_its_partial_for_display_and_never_replays_it(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    control.script([ENDLESS, {"when": "next", "steps": [{"text": "1. go"}, {"text": "ok"}]}])
    session = client.open_session(workspace)
    failed = session.turn("endless work", timeout=60)
    assert failed.outcome is parley.TurnStatus.FAILED
    assert failed.error == "driver failed: the plan was not carried out in 3 steps"
    assert labels(client, failed.turn_id) == ["plan", "act", "act", "act"]  # durable as is
    # A failed turn leaves the head where it was; its partial is on its record, shown
    # with it, and resuming it replays only its committed steps.
    assert failed.partial == "Stopped after 3 steps of the plan:\n1. read forever"
    assert client.store.run_state(failed.turn_id).partial == failed.partial
    session.turn("next one", timeout=60)
    for request in control.requests()[-2:]:
        assert not any("Stopped after" in m.get("text", "") for m in request["messages"])


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_driven_turn_resumes_after_its_worker_is_killed_without_planning_again(
    workspace: Path,
) -> None:
    """SIGKILL of the worker inside an act step's tool: the worker that takes the turn
    over drives it again from its committed steps, so the plan (committed) is not asked
    for again and the act step in flight is redone."""
    with chaos_fleet(workspace, pool="threads", host=PLAN_HOST) as chaos:
        chaos.control.script([GATED])
        handle = chaos.client.open_session(workspace).submit("gated work")
        chaos.control.wait_entered()
        victim = chaos.driver_pid(handle.turn_id)
        os.killpg(chaos.worker_group_of(victim), signal.SIGKILL)
        chaos.control.open_gate()
        result = handle.wait(60)
        assert result.outcome is parley.TurnStatus.FINISHED
        assert chaos.driver_pid(handle.turn_id) != victim
        assert [s.payload.label for s in chaos.client.store.steps_of(handle.turn_id)] == [
            "plan",
            "act",
            "act",
        ]
        planning = [r for r in chaos.control.requests() if PLANNING in chaos.control.user_texts(r)]
        assert len(planning) == 1
        kinds = [e.kind for e in handle.events()]
        assert EventKind.STEP_RESTARTED in kinds


@pytest.mark.postgres
def test_a_driven_call_that_asks_waits_and_the_driver_goes_on_from_its_answer(
    client: parley.Client, workspace: Path, control: Control
) -> None:
    """The act step's call waits for a person holding no driver; once approved, the turn
    is driven again as a resume from its committed steps: the call runs once, and the
    plan is not asked for again."""
    control.policy(ask_tools=["record_call"])
    control.script(
        [
            {
                "when": "record",
                "steps": [
                    {"text": "1. record it"},
                    {"tool_calls": [{"name": "record_call", "arguments": {"note": "n"}}]},
                    {"text": "recorded"},
                ],
            }
        ]
    )
    handle = client.open_session(workspace).submit("record this")
    wait_for(handle, parley.TurnStatus.WAITING)
    assert control.recorded_calls() == []
    [pending] = handle.approvals()
    handle.approve(pending.approval_id)
    result = handle.wait(timeout=60)
    assert (result.outcome, result.reply) == (parley.TurnStatus.FINISHED, "recorded")
    assert len(control.recorded_calls()) == 1
    assert labels(client, handle.turn_id) == ["plan", "act", "act"]
    assert sum(PLANNING in control.user_texts(r) for r in control.requests()) == 1
