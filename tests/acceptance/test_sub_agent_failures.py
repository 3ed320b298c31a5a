"""Sub-agents (docs/sub-agents.md) on the fleet, with real worker processes: the children of
one step run at the same time on different slots; a parent waiting for its children holds
no slot, so one worker at concurrency 1 still finishes a fan-out; and with every worker
SIGKILLed while children run and Redis emptied while the parent waits, each call still
has exactly one child, every child's tool ran as a turn's tools do, and the parent ends
once.

Each test starts a fleet of its own (:mod:`tests.support.chaos`), on prefork and on the
Procfile's worker line (``tests.support.chaos.DEPLOYMENTS``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from parley.schemas.events import EventKind
from parley.schemas.records import TurnStatus, Waiting
from tests.support.chaos import Chaos, chaos_fleet, deployment_options
from tests.support.deployments import on_fleet_deployments
from tests.support.fleet import flush_redis
from tests.support.waiting import wait_until

pytestmark = [on_fleet_deployments(), pytest.mark.postgres, pytest.mark.slow]

AGENTS_HOST = "tests.support.hosts:agents_host"
TOPICS = ("a", "b", "c")
ChaosFactory = Callable[..., Chaos]


@pytest.fixture
def start_fleet(
    workspace: Path, deployment: str, request: pytest.FixtureRequest
) -> Iterator[ChaosFactory]:
    """``start_fleet(workers=…, concurrency=…)``: this test's fleet, whose host declares
    the agents, as the deployment says unless told otherwise."""
    with ExitStack() as stack:

        def start(**options: Any) -> Chaos:
            options = {**deployment_options(deployment, request), "host": AGENTS_HOST, **options}
            return stack.enter_context(chaos_fleet(workspace, **options))

        yield start


def researcher(task: str) -> dict[str, Any]:
    return {"name": "researcher", "arguments": {"task": task}}


def fanning_out(chaos: Chaos, *, gated: bool) -> None:
    """A prompt ``fan out …`` calls the researcher three times in one step; each child
    records that its tool ran (and, ``gated``, then waits at the gate) and replies."""
    gate = [{"name": "wait_for_gate", "arguments": {}}] if gated else []
    children = [
        {
            "when": f"^topic {n}$",
            "steps": [
                {"tool_calls": [{"name": "record_call", "arguments": {"note": n}}, *gate]},
                {"text": "found {prompt}"},
            ],
        }
        for n in TOPICS
    ]
    fan_out = {
        "when": "^fan out",
        "steps": [
            {"tool_calls": [researcher(f"topic {n}") for n in TOPICS]},
            {"text": "all reported"},
        ],
    }
    chaos.control.script([fan_out, *children])


def child_replies(chaos: Chaos, run_id: str) -> list[str]:
    children = chaos.client.store.children_of_step(run_id, 0)
    return sorted(child.reply or "" for child in children.values())


@pytest.mark.timeout(180)
def test_the_children_of_a_step_run_at_the_same_time(start_fleet: ChaosFactory) -> None:
    chaos = start_fleet(workers=1, concurrency=4, pool="threads")
    fanning_out(chaos, gated=True)
    handle = chaos.client.open_session(chaos.workspace).submit("fan out")
    # All three children are inside their tool at once: none waits for another.
    wait_until(lambda: chaos.control.gate_calls == 3, 60, what="three children at the gate")
    assert handle.record().waiting_for is Waiting.AGENTS
    chaos.control.open_gate()
    result = handle.wait(60)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert child_replies(chaos, result.run_id) == [f"found topic {n}" for n in ("a", "b", "c")]


@pytest.mark.timeout(180)
def test_one_worker_at_concurrency_one_finishes_a_fan_out(start_fleet: ChaosFactory) -> None:
    chaos = start_fleet(workers=1, concurrency=1, pool="prefork")
    fanning_out(chaos, gated=False)
    result = chaos.client.open_session(chaos.workspace).submit("fan out").wait(90)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "all reported"
    assert child_replies(chaos, result.run_id) == [f"found topic {n}" for n in ("a", "b", "c")]
    assert sorted(chaos.control.recorded_notes()) == list(TOPICS)


@pytest.mark.timeout(240)
def test_a_fan_out_survives_killed_workers_and_an_emptied_redis(
    start_fleet: ChaosFactory,
) -> None:
    chaos = start_fleet(workers=2)
    fanning_out(chaos, gated=True)
    handle = chaos.client.open_session(chaos.workspace).submit("fan out")
    wait_until(lambda: chaos.control.gate_calls >= 1, 60, what="a child at the gate")
    assert handle.record().status is TurnStatus.WAITING
    chaos.kill_workers()  # while children run (one inside its tool)
    flush_redis(chaos.redis_url)  # while the parent waits
    chaos.control.open_gate()
    chaos.start_worker()
    result = handle.wait(180)
    assert result.outcome is TurnStatus.FINISHED, result.error
    assert result.reply == "all reported"
    children = chaos.client.store.children_of_step(result.run_id, 0)
    assert len(children) == 3  # one child per call, whatever crashed
    assert sorted(c.reply or "" for c in children.values()) == [
        f"found topic {n}" for n in ("a", "b", "c")
    ]
    # Every child's tool ran as a turn's do: at least once, once per committed step.
    notes = chaos.control.recorded_notes()
    assert set(notes) == set(TOPICS)
    ends = [
        e for e in chaos.client.store.events_after(result.turn_id, 0) if e.kind is EventKind.END
    ]
    assert len(ends) == 1  # the parent ended once
    for child in children.values():
        assert len(chaos.client.store.steps_of(child.turn_id)) == 2
