"""Counts of sub-agents at work (docs/sub-agents.md#9-counts), from real processes: a
fleet whose one worker runs two kicks at a time, a parent fanning out to three children
that wait at the gate: two run, one waits for a slot, and the parent waits for them
holding nothing.  ``parley status`` (text and ``--json``) and the sweeper's metrics say
so, and say nothing is left once the tree ended."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from parley.schemas.records import TurnStatus
from parley.store import statements as q
from tests.acceptance.test_sub_agents import ECHO, FAN_OUT
from tests.support.chaos import CHAOS_REDIS_URL
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import REPO, Fleet, flush_redis
from tests.support.helpers import Control
from tests.support.scrape import free_port, scrape
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

GATED = {
    "when": "^topic",
    "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "found {prompt}"}],
}


def status(env: Mapping[str, str], *argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "parley", "status", *argv],
        env=dict(env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done
    return done.stdout


def agents(env: Mapping[str, str]) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(status(env, "--json"))["agents"]
    return report


@pytest.mark.timeout(180)
def test_status_and_metrics_count_agents_running_and_waiting(workspace: Path) -> None:
    with fresh_postgres_database("agent_counts") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(
            database_url=url, redis_url=CHAOS_REDIS_URL, host="tests.support.hosts:agents_host"
        )
        fleet.start_worker(2, "threads")
        beat_port = free_port()
        fleet.start_beat(env={"PARLEY_METRICS_PORT": f"127.0.0.1:{beat_port}"})
        beat = f"http://127.0.0.1:{beat_port}/metrics"
        client = fleet.client()
        env = fleet.env()
        try:
            fleet.wait_ready()
            control = Control(workspace)
            control.script([FAN_OUT, GATED, ECHO])
            handle = client.open_session(workspace).submit("fan out to three at the gate")
            wait_until(lambda: control.gate_calls == 2, 60, what="two children at the gate")
            assert handle.record().status is TurnStatus.WAITING
            expected = {"running": 2, "waiting": 1, "parents_waiting": 1}
            assert agents(env) == expected
            lines = status(env).splitlines()
            assert (
                "agents: 2 running, 1 waiting to run; 1 turn(s) waiting for their agents" in lines
            )

            def counted() -> bool:
                seen = scrape(beat)
                return (
                    seen.value("parley_agent_turns", state="running"),
                    seen.value("parley_agent_turns", state="waiting"),
                    seen.value("parley_turns_waiting_agents"),
                ) == (2, 1, 1)

            wait_until(counted, 30, what="the sweeper to count the agents")

            control.open_gate()
            assert handle.wait(timeout=60).reply == "all three reported"
            assert agents(env) == {"running": 0, "waiting": 0, "parents_waiting": 0}
            assert not [line for line in status(env).splitlines() if line.startswith("agents:")]

            def cleared() -> bool:
                seen = scrape(beat)
                return (
                    seen.value("parley_agent_turns")
                    == 0
                    == seen.value("parley_turns_waiting_agents")
                )

            wait_until(cleared, 30, what="the sweeper to count none")

            # Each sweep counts them from the partial indexes of active runs and of runs
            # waiting for agents, not from every run.
            sql = str(q.AGENT_WORK.compile(client.store.engine))
            with client.store.engine.connect() as db:
                db.exec_driver_sql("SET enable_seqscan = off")  # a tiny table is read whole
                plan = " ".join(str(row) for row in db.exec_driver_sql(f"EXPLAIN {sql}").all())
            assert "ix_runs_agents" in plan and "ix_runs_active" in plan, plan
        finally:
            client.close()
            fleet.stop()
