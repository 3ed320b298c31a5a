"""Many replays at once (docs/replay.md#many): ``client.replay_many`` with its progress,
and ``parley replay --sessions FILE --model M --report out.html`` run as a process,
writing the page and its JSON, the page looked at in Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import sync_playwright

import parley
from parley.errors import InvalidRequest, SessionNotFound
from parley.gateway import GatewaySettings, create_app
from parley.models import ScriptedModel
from tests.acceptance.test_replay import CANDIDATE, ORIGINAL, SLOW

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).parents[2]

pytestmark = pytest.mark.embedded_only


def recorded(url: str, workspace: Path, count: int) -> list[str]:
    host = parley.Host(model=ScriptedModel(ORIGINAL))
    with parley.connect(url, host=host) as client:
        ids = []
        for _ in range(count):
            session = client.open_session(workspace)
            session.turn("fix the notes", timeout=60)
            session.turn("check them", timeout=60)
            ids.append(session.id)
    (workspace / "notes.txt").write_text("changed since")
    return ids


def test_replay_many_reports_every_session(tmp_path: Path, workspace: Path) -> None:
    url = f"sqlite:///{tmp_path / 'parley.db'}"
    ids = recorded(url, workspace, 3)
    with parley.connect(url, host=parley.Host(model=ScriptedModel(ORIGINAL))) as client:
        with pytest.raises(SessionNotFound):
            client.replay_many([*ids, "0" * 32])
        with pytest.raises(InvalidRequest):
            client.replay_many(ids, tools="never")
        many = client.replay_many(ids, model=ScriptedModel(CANDIDATE))
        many.wait(60)
        assert many.progress() == {"sessions": 3, "turns": 6, "ended": 6, "finished": 6}
        report = many.report()
        assert [s["original"] for s in report["sessions"]] == ids
        assert report["totals"]["sessions"] == 3 and report["totals"]["changed"] == 3
        for replay in many.replays:
            for _original, handle in replay.pairs:
                assert handle.record().turn_id  # (each an ordinary turn)
    assert (workspace / "notes.txt").read_text() == "changed since"
    assert not (workspace / "other.txt").exists()


def test_replay_many_is_one_batch_a_line_per_session(tmp_path: Path, workspace: Path) -> None:
    url = f"sqlite:///{tmp_path / 'parley.db'}"
    ids = recorded(url, workspace, 3)
    with parley.connect(url, host=parley.Host(model=ScriptedModel(ORIGINAL))) as client:
        with pytest.raises(InvalidRequest, match="listed twice"):
            client.replay_many([ids[0], ids[0]])
        assert client.store.list_batches(tenant=None, limit=10) == []  # refused: none made
        many = client.replay_many(ids, model=ScriptedModel(CANDIDATE))
        many.wait(60)
        batch = client.batch(many.batch_id)
        state = batch.status()
        assert state.status == "completed"
        assert state.request_counts == {"total": 3, "completed": 3, "failed": 0}
        lines = list(batch.output())
        # A line per session: its custom_id the original, its response the replay's
        # last turn (its session's turns ran in order before it).
        assert [line["custom_id"] for line in lines] == ids
        assert [line["response"]["body"]["id"] for line in lines] == [
            r.pairs[-1][1].turn_id for r in many.replays
        ]
        for replay in many.replays:
            assert {client.store.run_state(h.turn_id).priority for _o, h in replay.pairs} == {
                "batch"
            }
        # The report reads from the batch, from any process.
        again = client.replay_batch(many.batch_id)
        assert [r.session_id for r in again.replays] == [r.session_id for r in many.replays]
        assert again.report() == many.report()
        assert many.report()["batch"] == many.batch_id
        with pytest.raises(InvalidRequest, match="not a replay batch"):
            client.replay_batch(
                client.submit_batch(
                    [
                        {
                            "custom_id": "a",
                            "method": "POST",
                            "url": "/v1/responses",
                            "body": {"input": "check them"},
                        }
                    ],
                    root=workspace,
                ).id
            )


def test_the_gateway_shows_a_replay_batch_to_its_tenant(tmp_path: Path) -> None:
    token = "replay-0123456789abcdef"
    settings = GatewaySettings.from_environment(
        {"PARLEY_WORKSPACES": str(tmp_path), "PARLEY_GATEWAY_TOKENS": f"{token}=acme"}
    )
    url = f"sqlite:///{tmp_path / 'parley.db'}"
    root = tmp_path / "acme"
    root.mkdir()
    with parley.connect(url, host=parley.Host(model=ScriptedModel(ORIGINAL))) as client:
        ids = []
        for _ in range(2):
            session = client.open_session(root, tenant="acme")
            session.turn("check them", timeout=60)
            ids.append(session.id)
        many = client.replay_many(ids, model=ScriptedModel(CANDIDATE))
        many.wait(60)
    with TestClient(create_app(parley.connect(url), settings)) as http:
        shown = http.get(
            f"/v1/batches/{many.batch_id}", headers={"Authorization": f"Bearer {token}"}
        )
        assert shown.status_code == 200, shown.text
        batch = shown.json()
        assert (batch["object"], batch["status"]) == ("batch", "completed")
        assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
        assert batch["metadata"]["parley_replay"] == "true"
        output = http.get(
            f"/v1/files/{batch['output_file_id']}/content",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert [json.loads(line)["custom_id"] for line in output.text.splitlines()] == ids


def test_a_tenants_batch_marked_as_a_replay_is_not_read_as_one(tmp_path: Path) -> None:
    """A batch a tenant made over HTTP with a replay batch's metadata (its lines'
    ``custom_id`` naming another tenant's session) is no replay batch: ``replay_batch``
    (``parley replay --batch``) refuses it rather than report that session as replayed."""
    token = "replay-0123456789abcdef"
    settings = GatewaySettings.from_environment(
        {"PARLEY_WORKSPACES": str(tmp_path), "PARLEY_GATEWAY_TOKENS": f"{token}=acme"}
    )
    url = f"sqlite:///{tmp_path / 'parley.db'}"
    with parley.connect(url, host=parley.Host(model=ScriptedModel(ORIGINAL))) as client:
        other = client.open_session(tmp_path, tenant="other")
        other.turn("check them", timeout=60)
        line = {
            "custom_id": other.id,
            "method": "POST",
            "url": "/v1/responses",
            "body": {"input": "check them"},
        }
        auth = {"Authorization": f"Bearer {token}"}
        with TestClient(create_app(client, settings)) as http:
            upload = http.post(
                "/v1/files",
                headers=auth,
                data={"purpose": "batch"},
                files={"file": ("in.jsonl", json.dumps(line).encode(), "application/jsonl")},
            )
            assert upload.status_code == 200, upload.text
            made = http.post(
                "/v1/batches",
                headers=auth,
                json={
                    "input_file_id": upload.json()["id"],
                    "endpoint": "/v1/responses",
                    "completion_window": "24h",
                    "metadata": {"parley_replay": "true"},
                },
            )
            assert made.status_code == 200, made.text
        with pytest.raises(InvalidRequest, match="not a replay batch"):
            client.replay_batch(made.json()["id"])


def test_cancelling_a_replay_batch_stops_every_turn_of_its_sessions(
    tmp_path: Path, workspace: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'parley.db'}"
    ids = recorded(url, workspace, 2)
    with parley.connect(url, host=parley.Host(model=ScriptedModel(ORIGINAL))) as client:
        many = client.replay_many(ids, model=ScriptedModel(SLOW))
        state = many.batch.cancel()
        assert state.status in ("cancelling", "cancelled")
        many.wait(60)
        assert many.batch.status().status == "cancelled"
        # A line is its session's every turn: the first (running or queued) and the
        # second, queued behind it, all end cancelled; none finished.
        outcomes = [h.record().outcome for r in many.replays for _o, h in r.pairs]
        assert outcomes == ["cancelled"] * 4
        assert many.progress() == {"sessions": 2, "turns": 4, "ended": 4, "cancelled": 4}


def test_the_command_writes_the_page_and_json(tmp_path: Path, workspace: Path) -> None:
    url = f"sqlite:///{tmp_path / 'parley.db'}"
    ids = recorded(url, workspace, 2)
    listing = tmp_path / "sessions.txt"
    listing.write_text("# yesterday's\n" + "\n".join(ids) + "\n")
    original, candidate = tmp_path / "original.json", tmp_path / "candidate.json"
    original.write_text(json.dumps(ORIGINAL))
    candidate.write_text(json.dumps(CANDIDATE))
    page = tmp_path / "out.html"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "parley",
            "--db",
            url,
            "--host",
            f"scripted:{original}",
            "replay",
            "--sessions",
            str(listing),
            "--model",
            f"scripted:{candidate}",
            "--report",
            str(page),
            "--timeout",
            "60",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "4 turns, 2 changed" in done.stdout
    report = json.loads(page.with_suffix(".json").read_text())
    assert report["totals"]["turns"] == 4
    assert (workspace / "notes.txt").read_text() == "changed since"
    # The batch's id first, as `parley batch submit` prints it; `parley batch status`
    # shows the replay batch, and `parley replay --batch` writes its report again.
    batch_id = done.stdout.splitlines()[0]
    assert batch_id == report["batch"]
    status = parley_command(url, "batch", "status", batch_id, "--json")
    assert json.loads(status.stdout)["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    again = tmp_path / "again.html"
    parley_command(url, "replay", "--batch", batch_id, "--report", str(again))
    assert json.loads(again.with_suffix(".json").read_text()) == report

    assert Path(CHROMIUM).exists(), "needs Debian's Chromium: apt-get install chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        view = browser.new_page()
        view.goto(page.as_uri())
        assert "2 sessions, 4 turns" in view.inner_text("#summary")
        assert view.locator("#turns tr.changed").count() == 2
        assert view.locator("#turns li.added").count() == 4
        assert "fixed it" in view.inner_text("#turns")
        assert batch_id in view.inner_text("#summary")
        view.screenshot(path=str(tmp_path / "replay.png"), full_page=True)
        browser.close()


def parley_command(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "parley", "--db", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_a_missing_sessions_file_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "parley",
            "--db",
            f"sqlite:///{tmp_path / 'p.db'}",
            "replay",
            "--sessions",
            str(tmp_path / "none.txt"),
            "--report",
            str(tmp_path / "o.html"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert not (tmp_path / "o.html").exists()
