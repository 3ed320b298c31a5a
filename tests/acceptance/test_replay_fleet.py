"""Replay on the fleet (docs/replay.md): the workers run the replayed turns with their
own host and the model the replay names; a recorded write does not run again (checked
on disk); a model object, which cannot reach the workers, is refused; a judge model
scores the report where it is computed, once per turn, a turn it fails on unscored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parley.errors import InvalidRequest
from parley.models import ScriptedModel
from tests.acceptance.conftest import ClientFactory
from tests.acceptance.test_replay import CANDIDATE, ORIGINAL, SLOW
from tests.support.deployments import on_deployments
from tests.support.helpers import RecordingModel

pytestmark = on_deployments("fleet-postgres")


def test_a_fleet_replays_against_a_named_model(
    make_client: ClientFactory, workspace: Path, tmp_path: Path
) -> None:
    client = make_client(ORIGINAL["rules"])
    session = client.open_session(workspace)
    assert session.turn("fix the notes", timeout=60).reply == "fixed"
    assert session.turn("check them", timeout=60).reply == "checked"
    (workspace / "notes.txt").write_text("changed since")
    candidate = tmp_path / "candidate.json"
    candidate.write_text(json.dumps(CANDIDATE))
    with pytest.raises(InvalidRequest, match="workers hold the host"):
        client.replay(session.id, model=ScriptedModel(CANDIDATE))
    replay = client.replay(session.id, model=f"scripted:{candidate}")
    assert [r.reply for r in replay.wait(60)] == ["fixed it", "checked"]
    assert client.session(replay.session_id).replay_of == session.id
    assert (workspace / "notes.txt").read_text() == "changed since"
    assert not (workspace / "other.txt").exists()
    assert replay.report()["totals"]["changed"] == 1


JUDGE = {
    "rules": [
        {"when": "Second answer:\nfixed it", "steps": [{"text": "0.4"}]},
        {"when": "Second answer", "steps": [{"text": "I would rather not say"}]},
    ]
}


def test_a_judge_model_scores_a_fleet_replay_once_per_turn(
    make_client: ClientFactory, workspace: Path, tmp_path: Path
) -> None:
    client = make_client(ORIGINAL["rules"])
    sessions = [client.open_session(workspace) for _ in range(2)]
    for session in sessions:
        session.turn("fix the notes", timeout=60)
        session.turn("check them", timeout=60)
    candidate, judge_file = tmp_path / "candidate.json", tmp_path / "judge.json"
    candidate.write_text(json.dumps(CANDIDATE))
    judge_file.write_text(json.dumps(JUDGE))
    many = client.replay_many([s.id for s in sessions], model=f"scripted:{candidate}")
    many.wait(120)
    judge = RecordingModel(ScriptedModel(JUDGE))
    report = many.report(scorer=judge)
    # Asked here, once per turn (four); the turn it answered no number for is unscored,
    # and says why, and the rest of the report stands.
    assert len(judge.requests) == 4
    turns = [t for s in report["sessions"] for t in s["turns"]]
    assert [t["score"] for t in turns] == [0.4, None, 0.4, None]
    assert all("answered no number" in t["score_error"] for t in turns[1::2])
    assert "score_error" not in turns[0]
    assert (report["totals"]["score"], report["totals"]["score_errors"]) == (0.4, 2)
    # The judge named as PARLEY_MODEL names a model, resolved in this process.
    named = many.report(scorer=f"scripted:{judge_file}")
    assert [t["score"] for s in named["sessions"] for t in s["turns"]] == [0.4, None, 0.4, None]


def test_a_fleet_replay_batch_cancelled_stops_every_turn(
    make_client: ClientFactory, workspace: Path, tmp_path: Path
) -> None:
    client = make_client(ORIGINAL["rules"])
    sessions = [client.open_session(workspace) for _ in range(2)]
    for session in sessions:
        session.turn("fix the notes", timeout=60)
        session.turn("check them", timeout=60)
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(SLOW))
    many = client.replay_many([s.id for s in sessions], model=f"scripted:{slow}")
    many.batch.cancel()
    many.wait(120)
    assert many.batch.status().status == "cancelled"
    assert many.progress() == {"sessions": 2, "turns": 4, "ended": 4, "cancelled": 4}


@pytest.mark.slow
def test_two_hundred_sessions_replay_at_once_on_the_fleet(
    make_client: ClientFactory, workspace: Path, tmp_path: Path
) -> None:
    """The issue's showing: 200 recorded sessions replayed against a second model at
    once, the report over them all, and no recorded write run again."""
    client = make_client(ORIGINAL["rules"])
    sessions = [client.open_session(workspace) for _ in range(200)]
    handles = [h for s in sessions for h in (s.submit("fix the notes"), s.submit("check them"))]
    for handle in handles:
        handle.wait(300)
    (workspace / "notes.txt").write_text("changed since")
    candidate = tmp_path / "candidate.json"
    candidate.write_text(json.dumps(CANDIDATE))
    many = client.replay_many([s.id for s in sessions], model=f"scripted:{candidate}")
    many.wait(300)
    assert many.progress() == {"sessions": 200, "turns": 400, "ended": 400, "finished": 400}
    # One batch, a line per session, as `GET /v1/batches/{id}` and `parley batch` show it.
    assert client.batch(many.batch_id).status().request_counts == {
        "total": 200,
        "completed": 200,
        "failed": 0,
    }
    totals = many.report()["totals"]
    assert (totals["sessions"], totals["turns"], totals["changed"]) == (200, 400, 200)
    assert (workspace / "notes.txt").read_text() == "changed since"
    assert not (workspace / "other.txt").exists()
