"""`parley worker --processes N` is one worker of N Celery processes, supervised by its
parent (src/parley/cli/worker_processes.py), all real processes: kicks run on every
child; a child's SIGKILL is a crash of that child alone (restarted; the other's turns
go on; its own are resumed elsewhere); SIGTERM to the parent is a warm shutdown of
every child and an exit 0; a SIGKILL of the parent takes its children with it.  The
parent serves the sum of the children's metrics.  Children that cannot start at all
make it give up, with their status."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import parley
from tests.support.chaos import CHAOS_REDIS_URL, chaos_fleet
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import REPO, Fleet, flush_redis
from tests.support.scrape import free_port, scrape
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

GATED = [{"when": "gated", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "ok"}]}]


def children(log: Path) -> list[int]:
    """The pids of the children a supervising worker started, in order (from its log)."""
    return children_started(log.read_text(errors="replace"))


def children_started(log: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"started \(pid (\d+)\)", log)]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.timeout(180)
def test_a_worker_of_two_processes_runs_on_both_and_survives_one_crashing(
    workspace: Path,
) -> None:
    port = free_port()
    metrics = {"PARLEY_METRICS_PORT": f"127.0.0.1:{port}"}
    with chaos_fleet(
        workspace, pool="threads", concurrency=2, workers=1, processes=2, worker_env=metrics
    ) as chaos:
        (worker,) = chaos.workers
        log = chaos.fleet.log_of(worker)
        first, second = children(log)
        chaos.control.script(GATED)
        sessions = [chaos.client.open_session(chaos.workspace) for _ in range(4)]
        handles = [s.submit("gated turn") for s in sessions]
        # Two slots a process, prefetch one a slot: all four at the gate means two in each.
        # (A call is counted just before its process marks its entry: wait for both.)
        wait_until(
            lambda: chaos.control.gate_calls == 4 and len(chaos.control.entered_by()) == 2,
            what="every slot at the gate",
        )
        assert chaos.control.entered_by() == {first, second}
        drivers = {h.turn_id: chaos.driver_pid(h.turn_id) for h in handles}
        assert sorted(drivers.values()) == sorted([first, first, second, second])
        assert {chaos.worker_group_of(pid) for pid in drivers.values()} == {worker.pid}
        log_text = log.read_bytes()
        for number in (1, 2):
            assert f"parley-{worker.pid}-{number}@".encode() in log_text

        os.kill(first, signal.SIGKILL)
        # Started again in its place, the parent and the other child untouched.
        wait_until(lambda: len(children(log)) == 3, what="the killed child started again")
        wait_until(lambda: log.read_bytes().count(b"ready.") >= 3, 60, what="it to be ready")
        assert worker.poll() is None and alive(second)
        chaos.control.open_gate()
        results = {h.turn_id: h.wait(60) for h in handles}
        assert {r.outcome for r in results.values()} == {parley.TurnStatus.FINISHED}
        for turn_id, pid in drivers.items():
            state = chaos.client.store.run_state(turn_id)
            if pid == second:
                # Undisturbed: ran once, on the child that drove it from the start.
                assert (state.attempts, chaos.driver_pid(turn_id)) == (1, second)
            else:
                # Resumed by another process of the same worker after the crash.
                assert state.attempts == 2
                assert chaos.driver_pid(turn_id) != first
        # The parent's port sums every child's counts, the dead one's included.
        seen = scrape(f"http://127.0.0.1:{port}/metrics")
        assert seen.value("parley_turns_ended_total", outcome="finished") == 4
        assert seen.value("parley_turns_started_total", start="new") == 4


@pytest.mark.timeout(120)
def test_a_worker_of_two_processes_stops_with_its_parent(workspace: Path) -> None:
    """SIGTERM: a warm shutdown of both children, then the parent exits 0.  SIGKILL:
    the kernel kills the children (they asked for it before Celery started)."""
    with fresh_postgres_database("processes") as url:
        flush_redis(CHAOS_REDIS_URL)
        fleet = Fleet(database_url=url, redis_url=CHAOS_REDIS_URL)
        try:
            termed = fleet.start_worker(2, "threads", processes=2)
            killed = fleet.start_worker(2, "threads", processes=2)
            fleet.wait_ready()
            termed_children = children(fleet.log_of(termed))
            killed_children = children(fleet.log_of(killed))
            assert len(termed_children) == len(killed_children) == 2

            os.kill(termed.pid, signal.SIGTERM)
            assert termed.wait(30) == 0
            assert not [pid for pid in termed_children if alive(pid)]
            assert fleet.log_of(termed).read_bytes().count(b"stopped (0)") == 2

            os.kill(killed.pid, signal.SIGKILL)
            killed.wait(10)
            wait_until(
                lambda: not [pid for pid in killed_children if alive(pid)],
                timeout=5,
                what="the children of the killed parent to die",
            )
        finally:
            fleet.stop()


@pytest.mark.timeout(120)
def test_a_worker_whose_processes_cannot_start_gives_up_with_their_status(
    tmp_path: Path,
) -> None:
    """Each child dies at once (a Celery option it refuses): started again after a
    pause that doubles, and after five such deaths in a row the worker stops and exits
    with the children's status rather than restart them for ever."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    env.update(
        PARLEY_DATABASE_URL=f"sqlite:///{tmp_path / 'never.db'}",
        PARLEY_REDIS_URL="redis://127.0.0.1:9/0",
        PYTHONPATH=str(REPO),
    )
    ran = subprocess.run(
        [
            *(sys.executable, "-m", "parley", "worker"),
            *("--processes", "2", "--pool", "threads", "--concurrency", "lots"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert ran.returncode == 2, ran.stderr[-3000:]
    assert len(re.findall(r"died \(status 2\)", ran.stderr)) == 5
    assert "5 quick deaths in a row: stopping the worker" in ran.stderr
    assert len(children_started(ran.stderr)) == 6  # two, then four restarts
    assert not [pid for pid in children_started(ran.stderr) if alive(pid)]
