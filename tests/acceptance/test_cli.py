"""The command line as a user runs it: the demo, and the commands it relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def parley(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parley", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        check=False,
    )


def test_the_demo_tells_the_whole_story_and_exits_0(tmp_path: Path) -> None:
    run = parley("demo", "--dir", str(tmp_path))
    assert run.returncode == 0, run.stderr
    out = run.stdout
    for expected in (
        "It retries 502 and 504",
        "refused by deny_write:secrets/**",
        "steer delivered: actually, only touch the docs",
        "outcome cancelled after 1 committed step(s)",
        "Step 3 of 3: done.",
        "◀ head",
        "We were on the retry policy",
        "demo complete",
    ):
        assert expected in out, expected
    workspace = tmp_path / "workspace"
    assert (workspace / "secrets" / "api_token.txt").read_text() == "tok-OLD\n"
    assert (workspace / "docs" / "retries.md").exists()
    assert (workspace / "migration.log").read_text().splitlines() == [
        "applied step 1",
        "applied step 2",
    ]


def test_commands_work_from_the_environment_and_errors_are_one_clear_line(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps({"rules": [{"when": ".*", "steps": [{"text": "heard: {prompt}"}]}]})
    )
    env = {
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "PARLEY_HOST": f"scripted:{script}",
    }
    created = parley("new", str(tmp_path), env=env)
    assert created.returncode == 0, created.stderr
    session_id = created.stdout.strip()

    turn = parley("submit", session_id, "hello there", env=env)
    assert turn.returncode == 0, turn.stderr
    assert "heard: hello there" in turn.stdout
    turn_id = turn.stdout.strip().splitlines()[-1].split()[-1]

    assert "hello there" in parley("history", session_id, env=env).stdout
    assert "◀ head" in parley("tree", session_id, env=env).stdout
    assert "finished" in parley("follow", turn_id, env=env).stdout

    missing = parley("history", "00000000-0000-0000-0000-000000000000", env=env)
    assert missing.returncode == 2
    assert missing.stdout.startswith("SessionNotFound:")
    empty = parley("submit", session_id, "   ", env=env)
    assert empty.returncode == 2 and "InvalidRequest" in empty.stdout
    assert len(parley("history", session_id, env=env).stdout.strip().splitlines()) == 1
