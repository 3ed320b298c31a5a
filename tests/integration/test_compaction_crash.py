"""A process killed during a turn's compaction (docs/compaction.md#when) leaves none or a
whole one: killed in the summarizing call, nothing is stored and the turn's next attempt
compacts; killed after the compaction committed, the next attempt starts from it and
makes none again.  Real processes: the turn's driver is a child SIGKILLed at a gate."""

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

RULES = [
    {"when": "^USER: ", "steps": [{"text": "## Goal\nbig prompts\n## Next steps\nmore"}]},
    {"when": ".*", "steps": [{"text": "ok"}]},
]
BIG = "z" * 3000  # about 750 tokens a prompt: the third turn's request passes 2,000
POLICY = {"strategy": "summarize", "threshold": 0.5, "keep_turns": 1, "window": 4000}

# The child drives the third turn with a model that stops for good at the gate: in the
# summarizing call ("summary") or in the turn's first step ("step").
CHILD = """
import json, pathlib, sys, time
import parley
from parley.engine.compaction import SUMMARY_INSTRUCTIONS

db, session_id, gate, stage = sys.argv[1:5]
rules, policy = json.loads(sys.argv[5]), json.loads(sys.argv[6])

class GatedModel:
    name = "gated"

    def __init__(self):
        self.inner = parley.models.ScriptedModel({"rules": rules})

    def stream(self, request, on_delta):
        summary = request.prefix.system_prompt == SUMMARY_INSTRUCTIONS
        if stage == ("summary" if summary else "step"):
            pathlib.Path(gate).touch()
            time.sleep(3600)
        return self.inner.stream(request, on_delta)

host = parley.Host(model=GatedModel(), tools=[], compaction=parley.Compaction(**policy))
client = parley.connect(db, host=host)
handle = client.session(session_id).submit("third " + "z" * 3000)
print(handle.turn_id, flush=True)
handle.wait()
"""


def host() -> parley.Host:
    model = parley.models.ScriptedModel({"rules": RULES})
    return parley.Host(model=model, tools=[], compaction=parley.Compaction(**POLICY))  # type: ignore[arg-type]


def killed_in(stage: str, db: str, session_id: str, tmp_path: Path) -> str:
    """Start the child on the session's third turn, SIGKILL it at ``stage``'s gate;
    the turn's id."""
    gate = tmp_path / f"{stage}-entered"
    argv = [db, session_id, str(gate), stage, json.dumps(RULES), json.dumps(POLICY)]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *argv],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=tmp_path,
    )
    assert child.stdout is not None
    turn_id = child.stdout.readline().strip()
    deadline = time.monotonic() + 30
    while not gate.exists():
        assert time.monotonic() < deadline and child.poll() is None, "never reached the gate"
        time.sleep(0.02)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait(10)
    child.stdout.close()
    return turn_id


@pytest.mark.parametrize("stage", ["summary", "step"])
def test_a_crash_during_compaction_leaves_none_or_a_whole_one(stage: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with parley.connect(db, host=host()) as client:
        session = client.open_session(str(tmp_path))
        session.turn(f"first {BIG}")
        session.turn(f"second {BIG}")
    turn_id = killed_in(stage, db, session.id, tmp_path)

    with parley.connect(db) as reader:  # no host: it reads, and drives nothing
        left = reader.session(session.id).compactions()
        # Killed in the summary: nothing of it; killed after: the whole record.
        assert len(left) == (0 if stage == "summary" else 1)
        assert all(c.made_by_turn_id == turn_id and c.text for c in left)

    # The next process with a host drives the stranded turn from where it was.
    with parley.connect(db, host=host()) as client:
        result = client.attach(turn_id).wait(60)
        assert result.outcome is parley.TurnStatus.FINISHED
        [made] = client.session(session.id).compactions()  # exactly one, either way
        assert made.made_by_turn_id == turn_id
        assert made.through_turn_id == client.session(session.id).history()[0].turn_id
        kinds = [e.kind for e in client.attach(turn_id).events()]
        assert kinds.count(EventKind.STARTED) == 2
        assert kinds.count(EventKind.COMPACTED) == 1
        # Made by the attempt that was killed after it, or by the one after the kill.
        second_start = len(kinds) - 1 - kinds[::-1].index(EventKind.STARTED)
        compacted_at = kinds.index(EventKind.COMPACTED)
        assert (compacted_at > second_start) is (stage == "summary")
        assert [s.index for s in client.store.steps_of(turn_id)] == [0]
