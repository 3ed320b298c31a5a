"""The batch progress bar's second line (src/parley/cli/batch_progress.py): where the
lines stand, and the lines' child turns while their agent calls run them."""

from __future__ import annotations

from parley.cli.batch_progress import standing

LINES = {"done": 3, "failed": 1, "running": 2, "throttled": 0}


def test_the_lines_alone_while_no_child_turn_runs() -> None:
    quiet = {**LINES, "agents_running": 0, "agents_waiting": 0}
    assert standing(quiet) == "done 3 · failed 1 · running 2 · waiting for capacity 0"


def test_the_lines_child_turns_follow_them() -> None:
    busy = {**LINES, "agents_running": 5, "agents_waiting": 7}
    assert standing(busy) == (
        "done 3 · failed 1 · running 2 · waiting for capacity 0 · agents 5 running, 7 waiting"
    )
