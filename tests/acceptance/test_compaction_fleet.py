"""A fleet worker killed during a turn's compaction (docs/compaction.md#when): the turn's
summarizing call waits at a gate in one worker, which is SIGKILLed there; the other
worker takes the turn over, compacts, and finishes it. One compaction, one ``compacted``
event: a crash leaves none or a whole one, never two."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import parley
from parley.schemas.events import EventKind
from tests.support.chaos import Chaos, chaos_fleet, deployment_options
from tests.support.deployments import on_fleet_deployments
from tests.support.events import assert_once_in_order
from tests.support.waiting import wait_until

pytestmark = [on_fleet_deployments(), pytest.mark.postgres, pytest.mark.slow]

BIG_REPLY = "A long answer. " * 1500  # about 5,600 tokens a turn
RULES = [
    {"when": "^USER: ", "steps": [{"text": "## Goal\nlong answers\n## Next steps\nmore"}]},
    {"when": "^big", "steps": [{"text": BIG_REPLY, "chunk_chars": 2000}]},
]


@pytest.fixture
def chaos(workspace: Path, deployment: str, request: pytest.FixtureRequest) -> Iterator[Chaos]:
    options = deployment_options(deployment, request)
    with chaos_fleet(workspace, host="tests.support.hosts:compacting_host", **options) as harness:
        yield harness


def test_a_worker_killed_in_a_summary_leaves_no_compaction_and_the_next_makes_one(
    chaos: Chaos,
) -> None:
    chaos.control.script(RULES)
    session = chaos.client.open_session(chaos.workspace)
    for n in range(2):
        assert session.turn(f"big {n}", timeout=60).outcome is parley.TurnStatus.FINISHED
    gate = chaos.control.dir
    (gate / "summary-gate").touch()
    handle = session.submit("big 2")  # its first request passes the threshold
    wait_until(lambda: (gate / "summary-entered").exists(), timeout=60)
    victim = chaos.driver_pid(handle.turn_id)
    os.killpg(chaos.worker_group_of(victim), signal.SIGKILL)
    assert session.compactions() == []  # killed in the summary: nothing of it
    (gate / "summary-open").touch()  # the next worker's summary goes through

    result = handle.wait(90)
    assert result.outcome is parley.TurnStatus.FINISHED
    [made] = session.compactions()
    assert made.made_by_turn_id == handle.turn_id
    assert made.through_turn_id == session.history()[0].turn_id
    events = list(handle.events())
    assert_once_in_order(events)
    kinds = [e.kind for e in events]
    assert kinds.count(EventKind.COMPACTED) == 1
    assert kinds.count(EventKind.STARTED) >= 2
    assert chaos.driver_pid(handle.turn_id) != victim
    assert [s.index for s in chaos.client.store.steps_of(handle.turn_id)] == [0]
