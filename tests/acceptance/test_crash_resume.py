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
from schemas.events import EventKind
from tests.acceptance.conftest import ClientFactory
from workers.store import SqlStore

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
handle = client.session(sys.argv[2]).submit("crash test")
print(handle.turn_id, flush=True)
handle.wait()
"""


@pytest.mark.embedded_only  # the fleet's own crash tests kill real workers
def test_a_turn_killed_mid_step_resumes_in_another_process(
    make_client: ClientFactory, workspace: Path, db_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": RULES}))
    client = make_client(host=parley.Host(model=parley.models.ScriptedModel(script)))
    session = client.open_session(workspace)

    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, db_url, session.id],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PARLEY_HOST": f"scripted:{script}"},
        start_new_session=True,
    )
    assert child.stdout is not None
    turn_id = child.stdout.readline().strip()
    store: SqlStore = client.store
    deadline = time.monotonic() + 30
    while store.run_state(turn_id).steps < 1:  # step 0 committed, step 1 now streams
        assert time.monotonic() < deadline, "the child never committed its first step"
        time.sleep(0.02)
    time.sleep(0.3)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(10)
    child.stdout.close()

    stranded = store.run_state(turn_id)
    assert stranded.status is parley.TurnStatus.RUNNING and stranded.steps == 1

    handle = session.resume(turn_id)
    result = handle.wait(60)
    assert (result.turn_id, result.run_id) == (turn_id, stranded.run_id)
    assert result.outcome is parley.TurnStatus.FINISHED
    assert result.reply == SLOW_TEXT
    assert [s.index for s in store.steps_of(turn_id)] == [0, 1]  # each step exactly once
    assert store.run_state(turn_id).attempts == 2

    events = list(client.attach(turn_id).events())
    kinds = [e.kind for e in events]
    assert kinds.count(EventKind.STARTED) == 2
    restarted = kinds.index(EventKind.STEP_RESTARTED)
    assert events[restarted].data == {"index": 1, "reason": "resumed"}
    tokens = [i for i, e in enumerate(events) if e.kind is EventKind.TOKEN]
    assert tokens and min(tokens) > restarted
    assert "".join(events[i].data["text"] for i in tokens) == SLOW_TEXT
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))
