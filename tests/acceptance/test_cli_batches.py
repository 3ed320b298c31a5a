"""``parley batch`` (docs/batches.md#on-the-command-line) as a user runs it: ``submit``
prints the batch's id as its first line and, embedded, runs the lines to the end;
``status``, ``results -o`` and ``cancel``; a bad file refused with exit status 2 and
nothing written; and on a real terminal (tmux) a progress bar that counts the lines
done and ends with the batch."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import parley
from tests.support.terminal import Terminal

PARLEY = str(Path(sys.executable).parent / "parley")
SCRIPT = {"rules": [{"when": ".", "steps": [{"text": "ok: {last_message}"}]}]}
SLOW = {
    "rules": [{"when": ".", "steps": [{"text": "a b c d e f", "chunk_chars": 2, "delay_ms": 60}]}]
}


def write_lines(path: Path, count: int, *, broken: bool = False) -> Path:
    rows = [
        json.dumps(
            {
                "custom_id": f"l{n}",
                "method": "POST",
                "url": "/v1/responses",
                "body": {"input": f"line {n}"},
            }
        )
        for n in range(count)
    ]
    if broken:
        rows.append("{broken")
    path.write_text("\n".join(rows) + "\n")
    return path


def run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.json"
    if not script.exists():
        script.write_text(json.dumps(SCRIPT))
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    return subprocess.run(
        [PARLEY, "--db", db, "--host", f"scripted:{script}", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_submit_prints_the_id_first_and_runs_the_batch_to_its_end(tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.jsonl", 5, broken=True)
    submitted = run(tmp_path, "batch", "submit", str(source), "--root", str(tmp_path))
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.splitlines()[0]
    assert re.fullmatch(r"batch_[0-9a-f]{32}", batch_id), submitted.stdout
    assert "completed: 5 completed, 1 failed, of 6" in submitted.stderr

    status = run(tmp_path, "batch", "status", batch_id)
    assert status.returncode == 0 and "completed" in status.stdout
    as_json: dict[str, Any] = json.loads(
        run(tmp_path, "batch", "status", "--json", batch_id).stdout
    )
    assert as_json["request_counts"] == {"total": 6, "completed": 5, "failed": 1}

    out = tmp_path / "out.jsonl"
    results = run(tmp_path, "batch", "results", batch_id, "-o", str(out))
    assert results.returncode == 0, results.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(str(r["custom_id"]) for r in rows) == sorted(
        [f"l{n}" for n in range(5)] + ["None"]
    )
    answered = {r["custom_id"]: r["response"]["body"]["output_text"] for r in rows if r["response"]}
    assert answered["l3"] == "ok: line 3"
    cancelled = run(tmp_path, "batch", "cancel", batch_id)
    assert cancelled.returncode == 0 and "completed" in cancelled.stdout  # (it had ended)


def test_a_bad_file_or_id_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    missing = run(tmp_path, "batch", "submit", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "no file" in missing.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    refused = run(tmp_path, "batch", "submit", str(empty), "--root", str(tmp_path))
    assert refused.returncode == 2 and "no lines" in refused.stderr
    unknown = run(tmp_path, "batch", "status", "batch_0123456789abcdef0123456789abcdef")
    assert unknown.returncode == 2 and "no batch" in unknown.stderr
    with parley.connect(f"sqlite:///{tmp_path / 'cli.db'}") as client:
        assert client.store.table_counts()["batches"] == 0


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_a_terminal_shows_a_progress_bar_that_ends_with_the_batch(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SLOW))
    source = write_lines(tmp_path / "in.jsonl", 40)
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    command = [PARLEY, "--db", db, "--host", f"scripted:{script}", "batch", "submit"]
    term = Terminal(
        f"parley-test-{uuid.uuid4().hex[:8]}", [*command, str(source), "--root", str(tmp_path)],
        tmp_path, env={"PARLEY_BATCH_WINDOW": "4"},
    )  # fmt: skip
    terminals.append(term)

    first = term.wait_for(r"batch_[0-9a-f]{32}")
    assert first.strip().splitlines()[0].startswith("batch_")
    # Mid-way: some lines done, some running, the rate and the bar's count.
    mid = term.wait_for(r"done [1-9]\d* · failed 0 · running [1-4] · waiting for capacity 0")
    assert re.search(r"\d+/40", mid) and "lines/s" in mid
    end = term.wait_for(r"\[exited\]", timeout=60)
    assert "40/40" in end and "done 40 · failed 0 · running 0" in end
    assert "completed: 40 completed, 0 failed, of 40" in end
