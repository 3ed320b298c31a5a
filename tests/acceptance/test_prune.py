"""``parley prune`` as an operator runs it (docs/operations.md#retention): bad input is one clear
line and changes nothing; on a running fleet it deletes the ended sessions past the cut,
their Redis keys with them, while a turn runs in a tool, another waits for an answer, one
waits in line and a session takes turn after turn; those are kept whole, a submission
racing the prune lands or fails cleanly, and the fleet goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

import parley
from parley.coordination import constants as c
from parley.errors import SessionNotFound
from parley.schemas.records import TurnStatus
from tests.support.databases import fresh_postgres_database
from tests.support.fleet import REDIS_TEST_URL, Fleet, flush_redis
from tests.support.helpers import Control
from tests.support.store_rows import ROWS_OF_SESSION, age, rows_of
from tests.support.waiting import wait_until

ECHO = {"when": ".*", "steps": [{"text": "heard: {last_message}"}]}
GATE = {"when": "gate", "steps": [{"tool_calls": [{"name": "wait_for_gate"}]}, {"text": "out"}]}
PUSH = {
    "when": "push",
    "steps": [{"tool_calls": [{"name": "record_call", "arguments": {}}]}, {"text": "pushed"}],
}
LONG_AGO = timedelta(days=10)
GONE = dict.fromkeys(ROWS_OF_SESSION, 0)


def parley_cli(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parley", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **env},
        stdin=subprocess.DEVNULL,
        check=False,
    )


def workspace_of(tmp_path: Path, name: str, rules: list[dict[str, Any]]) -> tuple[Path, Control]:
    """A workspace with a control directory of its own (its own script and gate)."""
    root = tmp_path / name / "ws"
    root.mkdir(parents=True)
    control = Control(root)
    control.script(rules)
    return root, control


@pytest.mark.parametrize("days", ["-1", "-0.5", "abc", "nan", "inf", "", "1e400", "3 days"])
def test_bad_days_are_one_clear_line_and_prune_nothing(tmp_path: Path, days: str) -> None:
    env = {"PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'p.db'}"}
    with parley.connect(env["PARLEY_DATABASE_URL"], host=_echo_host()) as client:
        session = client.open_session(tmp_path)
        session.turn("hello")
    run = parley_cli("prune", f"--older-than={days}", env=env)
    assert run.returncode == 2, run
    assert run.stdout == ""
    [line] = run.stderr.splitlines()
    assert line.startswith("InvalidRequest: --older-than takes"), line
    with parley.connect(env["PARLEY_DATABASE_URL"]) as client:
        assert [t.prompt for t in client.session(session.id).history()] == ["hello"]


def test_prune_needs_its_cut_and_refuses_a_database_that_is_not_there(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.db"
    run = parley_cli(
        "prune", "--older-than", "1", env={"PARLEY_DATABASE_URL": f"sqlite:///{missing}"}
    )
    assert run.returncode == 2 and "no database at" in run.stderr
    assert not missing.exists()
    run = parley_cli("prune", env={"PARLEY_DATABASE_URL": f"sqlite:///{missing}"})
    assert run.returncode == 2 and "--older-than" in run.stderr


def _echo_host() -> parley.Host:
    return parley.Host(model=parley.models.ScriptedModel({"rules": [ECHO]}))


@pytest.mark.postgres
@pytest.mark.slow
def test_prune_on_a_running_fleet_keeps_every_session_in_flight_and_the_fleet_goes_on(
    tmp_path: Path,
) -> None:
    with fresh_postgres_database("prune") as url:
        flush_redis(REDIS_TEST_URL)
        fleet = Fleet(database_url=url)
        try:
            fleet.start_worker(concurrency=4, pool="threads")
            fleet.start_beat()
            fleet.wait_ready()
            env = {k: v for k, v in fleet.env().items() if k != "PARLEY_HOST"}
            with parley.connect(url, redis_url=fleet.redis_url, queue=fleet.queue) as client:
                _prune_on(client, env, tmp_path)
        finally:
            fleet.stop()


def _prune_on(client: parley.Client, env: dict[str, str], tmp_path: Path) -> None:
    store = client.store
    keys = redis.Redis.from_url(REDIS_TEST_URL)
    # Ended ten days ago.
    old_root, _ = workspace_of(tmp_path, "old", [ECHO])
    old = client.open_session(old_root)
    old_turn = old.turn("hello", timeout=30)
    assert keys.exists(c.events_key(old_turn.turn_id))  # its replay buffer, in Redis
    # Idle as long, but a turn in flight: running in a tool, another queued behind it.
    gated_root, gated_control = workspace_of(tmp_path, "gated", [GATE, ECHO])
    gated = client.open_session(gated_root)
    running = gated.submit("through the gate")
    gated_control.wait_entered()
    queued = gated.submit("after the gate")
    # Idle as long, and waiting for a person's answer (holding no worker).
    asking_root, asking_control = workspace_of(tmp_path, "asking", [PUSH, ECHO])
    asking_control.policy(ask_tools=["record_call"])
    asking = client.open_session(asking_root)
    waiting = asking.submit("push it")
    wait_until(lambda: waiting.record().status is TurnStatus.WAITING, what="a waiting turn")
    for session in (old, gated, asking):
        age(store, session.id, LONG_AGO)
    in_flight = {s.id: rows_of(store, s.id) for s in (gated, asking)}

    # A session taking turn after turn meanwhile, on the other worker slots.
    busy_root, _ = workspace_of(tmp_path, "busy", [ECHO])
    busy = client.open_session(busy_root)
    outcomes: list[TurnStatus] = []
    refused: list[SessionNotFound] = []
    stop = threading.Event()

    def keep_busy() -> None:
        n = 0
        while not stop.is_set():
            try:
                handle = busy.submit(f"turn {n}")
            except SessionNotFound as exc:  # pruned between two turns: a clean refusal
                refused.append(exc)
                return
            outcomes.append(handle.wait(60).outcome)
            n += 1

    worker = threading.Thread(target=keep_busy)
    worker.start()
    try:
        wait_until(lambda: len(outcomes) >= 2, what="the busy session's first turns")

        first = parley_cli("prune", "--older-than", "5", env=env)
        assert first.returncode == 0, first.stderr
        assert f"pruned session {old.id} (1 turn(s)" in first.stdout
        assert "pruned 1 session(s), 1 turn(s)" in first.stdout
        for kept in (gated, asking, busy):
            assert kept.id not in first.stdout
        assert rows_of(store, old.id) == GONE
        assert not keys.exists(c.events_key(old_turn.turn_id), c.ends_key(old_turn.turn_id))
        assert old_root.is_dir()  # not asked to remove workspaces

        # Everything that has ended, now: the busy session is pruned between two of its
        # turns or not at all, and a submission racing the prune lands or is refused.
        second = parley_cli("prune", "--older-than", "0", env=env)
        assert second.returncode == 0, second.stderr
        assert gated.id not in second.stdout and asking.id not in second.stdout
    finally:
        stop.set()
        worker.join(60)
    assert outcomes and all(o is TurnStatus.FINISHED for o in outcomes), outcomes
    if busy.id in second.stdout:
        assert rows_of(store, busy.id) == GONE
        with pytest.raises(SessionNotFound):
            busy.submit("after the prune")
    else:
        assert not refused
        assert len(busy.tree()) == len(outcomes)
    assert {s.id: rows_of(store, s.id) for s in (gated, asking)} == in_flight

    # The fleet goes on with what was in flight.
    gated_control.open_gate()
    assert running.wait(30).outcome is TurnStatus.FINISHED
    assert queued.wait(30).outcome is TurnStatus.FINISHED
    [pending] = waiting.approvals()
    waiting.approve(pending.approval_id)
    assert waiting.wait(30).outcome is TurnStatus.FINISHED
    again = client.open_session(old_root)
    assert again.turn("still here?", timeout=30).reply == "heard: still here?"

    # Ended now: pruned with their workspaces.
    third = parley_cli("prune", "--older-than", "0", "--workspaces", env=env)
    assert third.returncode == 0, third.stderr
    for session, root in ((gated, gated_root), (asking, asking_root), (again, old_root)):
        assert f"pruned session {session.id}" in third.stdout
        assert f"workspace {os.path.realpath(root)}: removed" in third.stdout
        assert not root.exists()
        assert rows_of(store, session.id) == GONE
    keys.close()
