"""Sub-agents on the command line (docs/sub-agents.md#7-seen): ``parley submit``,
``parley follow`` and ``parley chat`` show a turn's children indented under their call,
each line named by its agent, a grandchild deeper than its parent; ``follow --after``
leaves out the children of the calls before that seq."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.acceptance.test_sub_agents import RULES
from tests.support.helpers import Control
from tests.support.terminal import Terminal

pytestmark = pytest.mark.embedded_only

REPO = Path(__file__).parents[2]
AGENTS_HOST = "tests.support.hosts:agents_host"


def parley(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "parley", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **env},
        stdin=subprocess.DEVNULL,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_submit_and_follow_show_children_indented_under_their_calls(tmp_path: Path) -> None:
    root = tmp_path / "workspace"
    root.mkdir()
    Control(root).script(RULES)
    env = {"PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}", "PARLEY_HOST": AGENTS_HOST}
    session_id = parley("new", str(root), env=env).stdout.strip()

    submitted = parley("submit", session_id, "fan out over three topics", env=env).stdout
    turn_id = submitted.strip().splitlines()[-1].split()[-1]
    followed = parley("follow", turn_id, env=env).stdout
    for shown in (submitted, followed):
        lines = shown.splitlines()
        started = [line for line in lines if "↳ researcher started (turn " in line]
        assert len(started) == 3 and all(re.match(r"^\s*\d+ ↳", line) for line in started)
        # Each child's text and end, one level in, named by its agent.
        for topic in ("alpha", "beta", "gamma"):
            assert f"  researcher │ found topic {topic}" in lines, shown
        assert lines.count("  researcher │ ■ finished") == 3, shown
        assert sum("↲ researcher finished" in line for line in lines) == 3
        assert "all three reported" in shown
        # A child's lines come after the first call's start (the children run at once:
        # which of them ends first is theirs to say; read after the end, the tree's
        # children are printed after the parent's own events).
        children = [
            lines.index(f"  researcher │ found topic {t}") for t in ("alpha", "beta", "gamma")
        ]
        assert lines.index(started[0]) < min(children)

    # From the seq of the last call's start on: only what came after, the children none.
    last_start = max(int(line.split()[0]) for line in followed.splitlines() if "↳" in line)
    later = parley("follow", turn_id, "--after", str(last_start), env=env).stdout
    assert "researcher │" not in later and "all three reported" in later

    # A grandchild is one level deeper than its parent, under the parent's call of it.
    nested = parley("submit", session_id, "nest the work", env=env).stdout.splitlines()
    assert "  researcher │ critic answered" in nested, nested
    assert "    critic │ checked" in nested, nested
    call = next(i for i, line in enumerate(nested) if "↳ researcher/critic started" in line)
    assert nested[call].startswith("  researcher │ ")
    assert call < nested.index("    critic │ checked")


def test_chat_shows_children_indented_under_their_call(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    root = tmp_path / "workspace"
    root.mkdir()
    Control(root).script(RULES)
    db = f"sqlite:///{tmp_path / 'chat.db'}"
    chat = [sys.executable, "-m", "parley", "--db", db, "--host", AGENTS_HOST, "chat"]
    term = Terminal(
        f"parley-test-{uuid.uuid4().hex[:8]}",
        [*chat, "--root", str(root)],
        tmp_path,
        env={"PYTHONPATH": str(REPO)},
    )
    terminals.append(term)
    term.wait_for(r"(?m)^you>")
    term.type("fan out over three topics")
    screen = term.wait_for(r"all three reported")
    term.wait_for(r"■ finished", 4)
    for topic in ("alpha", "beta", "gamma"):
        assert re.search(rf"(?m)^  researcher │ found topic {topic}$", screen), screen
    assert len(re.findall(r"↳ researcher started", screen)) == 3
    term.type("/quit")
    term.wait_for(r"\[exited\]")
