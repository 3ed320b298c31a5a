"""A process killed with SIGKILL mid-turn: another process continues the same turn and
run from the last committed step, and no step is committed twice (steps commit whole;
crash resume)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import parley
from parley.schemas.events import EventKind
from parley.store.sql_store import SqlStore
from tests.acceptance.conftest import ClientFactory
from tests.support.deployments import ALL, on_deployments
from tests.support.gateway import start_gateway

pytestmark = on_deployments(*ALL)

SLOW_TEXT = "".join(f"chunk{i:03d} " for i in range(300))
RULES = [
    {
        "when": "crash",
        "steps": [
            {"tool_calls": [{"name": "list_files"}]},
            {"text": SLOW_TEXT, "chunk_chars": 9, "delay_ms": 10},
        ],
    }
]

CHILD = """
import sys, parley
client = parley.connect(sys.argv[1])
session = client.session(sys.argv[2]) if len(sys.argv) > 2 else client.open_session(".")
handle = session.submit("crash test")
print(session.id, handle.turn_id, flush=True)
handle.wait()
"""


def start_child(
    db_url: str, script: Path, *session_id: str
) -> tuple[subprocess.Popen[str], str, str]:
    """A process that submits the slow turn with the scripted host and drives it: the
    process, the session id and the turn id."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, db_url, *session_id],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PARLEY_HOST": f"scripted:{script}"},
        cwd=script.parent,
        start_new_session=True,
    )
    assert child.stdout is not None
    session, turn_id = child.stdout.readline().split()
    return child, session, turn_id


def kill_mid_step(child: subprocess.Popen[str], store: SqlStore, turn_id: str) -> None:
    """SIGKILL the child once its turn committed step 0 and streams step 1."""
    deadline = time.monotonic() + 30
    while store.run_state(turn_id).steps < 1:
        assert time.monotonic() < deadline, "the child never committed its first step"
        time.sleep(0.02)
    time.sleep(0.3)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(10)
    assert child.stdout is not None
    child.stdout.close()


def assert_resumed_once(client: parley.Client, turn_id: str, run_id: str) -> None:
    """The turn finished in the same run, each step committed once, its second step
    redone after a ``step_restarted`` whose tokens make the step's whole text."""
    result = client.attach(turn_id).wait(60)
    store: SqlStore = client.store
    assert (result.turn_id, result.run_id) == (turn_id, run_id)
    assert result.outcome is parley.TurnStatus.FINISHED
    assert result.reply == SLOW_TEXT
    assert [s.index for s in store.steps_of(turn_id)] == [0, 1]  # each step exactly once
    assert store.run_state(turn_id).attempts == 2

    events = list(client.attach(turn_id).events())
    kinds = [e.kind for e in events]
    assert kinds.count(EventKind.STARTED) == 2
    restarted = kinds.index(EventKind.STEP_RESTARTED)
    assert events[restarted].data == {"index": 1, "reason": "resumed"}
    tokens = [i for i, e in enumerate(events) if e.kind is EventKind.TOKEN and i > restarted]
    assert tokens
    assert "".join(events[i].data["text"] for i in tokens) == SLOW_TEXT
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"rules": RULES}))
    return path


@pytest.mark.embedded_only  # the fleet's own crash tests kill real workers
def test_a_turn_killed_mid_step_goes_on_by_itself_in_a_process_running_then(
    make_client: ClientFactory, workspace: Path, db_url: str, script: Path
) -> None:
    """Another process with a host, already running, notices the dead process's turn
    (its lease's holder is gone from this machine) and goes on with it: no resume."""
    client = make_client(host=parley.Host(model=parley.models.ScriptedModel(script)))
    session = client.open_session(workspace)
    child, _, turn_id = start_child(db_url, script, session.id)
    kill_mid_step(child, client.store, turn_id)
    assert_resumed_once(client, turn_id, client.store.run_state(turn_id).run_id)


@pytest.mark.embedded_only
def test_a_turn_stranded_by_a_killed_process_goes_on_when_the_next_one_starts(
    make_client: ClientFactory, db_url: str, script: Path
) -> None:
    """Nothing with a host runs while the turn is stranded; the next process to connect
    with one drives it from its last committed step, as a restarted gateway does."""
    with parley.connect(db_url) as reader:  # no host: it reads, and drives nothing
        child, _, turn_id = start_child(db_url, script)
        kill_mid_step(child, reader.store, turn_id)
        time.sleep(1.0)  # stranded, and nobody notices
        stranded = reader.store.run_state(turn_id)
    assert stranded.status is parley.TurnStatus.RUNNING and stranded.steps == 1
    client = make_client(host=parley.Host(model=parley.models.ScriptedModel(script)))
    assert_resumed_once(client, turn_id, stranded.run_id)


@pytest.mark.embedded_only
def test_a_live_process_driving_a_turn_is_never_taken_over(
    make_client: ClientFactory, db_url: str, script: Path
) -> None:
    """Two processes with hosts on one database: the one that drives the turn keeps it
    to its end (one attempt, no restart), though the other sweeps for strays all along."""
    client = make_client(host=parley.Host(model=parley.models.ScriptedModel(script)))
    child, _, turn_id = start_child(db_url, script)
    assert child.wait(60) == 0
    assert child.stdout is not None
    child.stdout.close()
    state = client.store.run_state(turn_id)
    assert state.status is parley.TurnStatus.FINISHED and state.attempts == 1
    kinds = [e.kind for e in client.attach(turn_id).events()]
    assert EventKind.STEP_RESTARTED not in kinds and kinds.count(EventKind.STARTED) == 1


def test_an_embedded_gateway_killed_mid_turn_goes_on_with_it_when_started_again(
    tmp_path: Path, script: Path
) -> None:
    """What a newcomer runs (`scripts/start.sh`: an embedded gateway on SQLite), SIGKILLed
    during a turn and started again: the turn goes on from its last committed step by
    itself, and its stream tells readers the step was redone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    env |= {
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'runs.db'}",
        "PARLEY_HOST": f"scripted:{script}",
        "PYTHONPATH": str(Path(__file__).parents[2]),
    }
    tokens = {"acme": "tok-acme-0123456789abcdef"}
    first = start_gateway(env, tmp_path / "first", tokens=tokens)
    try:
        tenant = first.tenant("acme")
        session = tenant.new_session(workspace="repo")
        turn_id = tenant.submit(session["id"], "crash test")["turn_id"]
        deadline = time.monotonic() + 30
        while tenant.http.get(f"/v1/turns/{turn_id}").json()["steps"] < 1:
            assert time.monotonic() < deadline, "the gateway never committed the first step"
            time.sleep(0.05)
        time.sleep(0.3)  # step 1 streams
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait(10)
    finally:
        first.stop()
    second = start_gateway(env, tmp_path / "second", tokens=tokens)
    try:
        tenant = second.tenant("acme")
        ended = tenant.result(turn_id, wait=60)
        assert ended["status"] == "finished" and ended["reply"] == SLOW_TEXT
        events = tenant.event_json(turn_id)
        kinds = [e["kind"] for e in events]
        assert kinds.count("started") == 2 and kinds[-1] == "end"
        restarted = kinds.index("step_restarted")
        assert events[restarted]["data"] == {"index": 1, "reason": "resumed"}
        assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})
    finally:
        second.stop()
