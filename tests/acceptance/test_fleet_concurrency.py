"""One worker started with the Procfile's worker line drives as many turns at once as its
concurrency, all in its one process, with connection pools sized for them: no driver
finds Redis "unreachable" because a pool ran out, and every turn finishes.  It builds
its runtime before it takes a kick.  One tenant's interactive turns holding every slot
do not keep the next slot that frees from another tenant's turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import parley
from tests.support.chaos import chaos_fleet
from tests.support.fleet import procfile_worker
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SIGNS_OF_A_STARVED_POOL = (b"cannot reach Redis", b"cannot read", b"could not", b"Too many")


@pytest.mark.timeout(240)
def test_one_worker_on_the_procfile_line_drives_its_whole_concurrency_at_once(
    workspace: Path,
) -> None:
    pool, concurrency = procfile_worker()
    assert pool == "threads" and concurrency >= 100  # sized for turns that wait
    with chaos_fleet(workspace, pool=pool, concurrency=concurrency, workers=1) as chaos:
        chaos.control.script(
            [
                {
                    "when": "wait",
                    "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "ok"}],
                }
            ]
        )
        sessions = [chaos.client.open_session(chaos.workspace) for _ in range(concurrency)]
        handles = [s.submit("wait at the gate") for s in sessions]
        # Every turn is inside its tool at the same time, in the one worker process.
        wait_until(lambda: chaos.control.gate_calls == concurrency, timeout=120, what="all in")
        assert chaos.control.entered_by() == {chaos.workers[0].pid}
        chaos.control.open_gate()
        results = [h.wait(120) for h in handles]
        assert [r.outcome for r in results] == [parley.TurnStatus.FINISHED] * concurrency
        assert {r.reply for r in results} == {"ok"}
        assert [chaos.client.store.run_state(h.turn_id).attempts for h in handles] == [1] * len(
            handles
        )
        log = chaos.fleet.log_of(chaos.workers[0]).read_bytes()
        sizing = f"threads pool, concurrency {concurrency}: {concurrency} turn(s) at once"
        assert sizing.encode() in log
        assert not [s for s in SIGNS_OF_A_STARVED_POOL if s in log], log.decode()[-3000:]


@pytest.mark.timeout(120)
def test_a_worker_on_the_procfile_line_builds_its_runtime_before_it_takes_a_kick(
    workspace: Path,
) -> None:
    """Its host's imports take a second or more: built at the first kick, a backlog's
    first kicks would all wait for them (issue 42: the first call came 2.5 s after the
    backlog's submission).  Built before the worker says it is ready, no kick sent."""
    pool, concurrency = procfile_worker()
    with chaos_fleet(workspace, pool=pool, concurrency=concurrency, workers=1) as chaos:
        log = chaos.fleet.log_of(chaos.workers[0]).read_bytes()
        pid = chaos.workers[0].pid
        built = log.find(f"process {pid} built its runtime".encode())
        assert 0 <= built < log.find(b" ready."), log.decode()[-3000:]


@pytest.mark.timeout(180)
def test_one_tenants_interactive_turns_do_not_keep_the_workers_from_another(
    workspace: Path,
) -> None:
    """Issue 43: a tenant's long interactive turns held every slot, and the slots that
    freed went to its kicks queued ahead of another tenant's turn.  Four slots, twelve
    turns of one tenant, then one of another: that one starts at the first slot that
    frees, and the first tenant's waiting turns move to the batch lane, after it."""
    with chaos_fleet(workspace, pool="threads", concurrency=4, workers=1) as chaos:
        chaos.control.script(
            [
                {
                    "when": "^flood",
                    "steps": [
                        {
                            "text": "".join(f"w{i} " for i in range(10)),
                            "chunk_chars": 3,
                            "delay_ms": 500,
                        }
                    ],
                },
                {"when": ".*", "steps": [{"text": "heard: {last_message}"}]},
            ]
        )
        client = chaos.client
        flood = [
            client.open_session(chaos.workspace, tenant="flood").submit(f"flood {n}")
            for n in range(12)
        ]
        wait_until(
            lambda: sum(client.store.run_state(h.turn_id).attempts > 0 for h in flood) == 4,
            what="the flood to hold the four slots",
        )
        other = client.open_session(chaos.workspace, tenant="other").submit("hello")
        assert other.wait(60).outcome is parley.TurnStatus.FINISHED
        assert [h.wait(120).outcome for h in flood] == [parley.TurnStatus.FINISHED] * 12
        started = {h.turn_id: _started_at(chaos, h.turn_id) for h in [*flood, other]}
        first_four = sorted(flood, key=lambda h: started[h.turn_id])[:4]
        later = [h for h in flood if h not in first_four]
        assert all(started[other.turn_id] < started[h.turn_id] for h in later), started
        with client.store.engine.connect() as db:
            lanes = {
                row.turn_id: row.priority
                for row in db.execute(text("SELECT turn_id, priority FROM runs"))
            }
        assert {lanes[h.turn_id] for h in later} == {"batch"}  # moved to the batch lane


def _started_at(chaos: Any, turn_id: str) -> Any:
    with chaos.client.store.engine.connect() as db:
        return db.execute(
            text("SELECT started_at FROM runs WHERE turn_id = :t"), {"t": turn_id}
        ).scalar_one()
