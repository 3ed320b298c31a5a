"""One worker started with the Procfile's worker line drives as many turns at once as its
concurrency, all in its one process, with connection pools sized for them: no driver
finds Redis "unreachable" because a pool ran out, and every turn finishes."""

from __future__ import annotations

from pathlib import Path

import pytest

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
