"""An embedded ``parley batch submit`` stopped with Ctrl-C, with the real command: it
says how many lines are left and what runs them; ``parley batch results`` with no host
says that nothing runs them rather than wait forever; the next process with a host
(``parley gateway``, ``parley.connect(host=...)``) ends them, resuming the lines a
second Ctrl-C left mid-step; and while a submission runs its lines, another process with
a host leaves its queued lines to it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import parley
from parley.cli.batch_runners import UNRUN_SECONDS
from parley.coordination.constants import SWEEP_SECONDS
from parley.models.scripted import ScriptedModel
from tests.support.gateway import start_gateway
from tests.support.processes import as_from_a_terminal
from tests.support.waiting import wait_until

FAST = {"rules": [{"when": ".", "steps": [{"text": "done: {last_message}"}]}]}


def slow(chunks: int, delay_ms: int) -> dict[str, Any]:
    """A script whose every answer streams ``chunks`` chunks, ``delay_ms`` apart."""
    text = "".join(f"w{n} " for n in range(chunks))
    return {
        "rules": [{"when": ".", "steps": [{"text": text, "chunk_chars": 3, "delay_ms": delay_ms}]}]
    }


def write_lines(path: Path, count: int) -> Path:
    line = {"method": "POST", "url": "/v1/responses"}
    rows = [{**line, "custom_id": f"l{n}", "body": {"input": f"line {n}"}} for n in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def shell_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    return {**env, "COLUMNS": "200", "PYTHONUNBUFFERED": "1", **extra}


@contextmanager
def submitting(
    tmp_path: Path, db: str, script: Path, count: int, window: int
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``parley batch submit`` of ``count`` lines running (the process and the batch's
    id), its window ``window`` lines."""
    source = write_lines(tmp_path / "in.jsonl", count)
    command = ["--db", db, "--host", f"scripted:{script}", "batch", "submit", str(source)]
    with subprocess.Popen(
        [sys.executable, "-m", "parley", *command, "--root", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env=shell_env(PARLEY_BATCH_WINDOW=str(window)),
        preexec_fn=as_from_a_terminal,
    ) as process:
        assert process.stdout is not None
        try:
            yield process, process.stdout.readline().strip()
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()


def counts(db: str, batch_id: str) -> Any:
    with parley.connect(db) as reader:
        return reader.batch(batch_id).status().counts


def test_ctrl_c_says_what_is_left_results_says_nothing_runs_it_and_a_gateway_ends_it(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    script = tmp_path / "slow.json"
    script.write_text(json.dumps(slow(chunks=5, delay_ms=200)))  # a line takes a second
    with submitting(tmp_path, db, script, count=12, window=2) as (process, batch_id):
        wait_until(lambda: counts(db, batch_id).completed >= 1, 60, "a line's end")
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    left = counts(db, batch_id)
    unfinished = left.total - left.completed - left.failed
    assert 0 < unfinished < 12 and left.running == 0 and left.queued == unfinished
    stopping, said = err.splitlines()[-2:]
    assert stopping.startswith("stopping: no line starts from now on")
    assert said == (
        f"batch {batch_id}: {unfinished} of 12 lines left; the next process with a host on "
        f"this database runs them: `parley --db {db} --host scripted:{script} batch results "
        f"{batch_id}` (which prints them), or `parley --db {db} --host scripted:{script} gateway`"
    )

    # With no host, results gives what ended, then says that nothing runs the rest.
    started = time.monotonic()
    results = subprocess.run(
        [sys.executable, "-m", "parley", "--db", db, "batch", "results", batch_id],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=shell_env(),
    )  # fmt: skip
    assert results.returncode == 1, results.stderr
    assert time.monotonic() - started >= UNRUN_SECONDS  # not before a process could adopt them
    assert len(results.stdout.splitlines()) == 12 - unfinished
    [line] = results.stderr.splitlines()
    assert line.startswith(
        f"batch {batch_id}: {unfinished} lines queued and no process runs them: start one on "
        f"this database (`parley --db {db} gateway`)"
    )

    env = shell_env(PARLEY_DATABASE_URL=db, PARLEY_HOST=f"scripted:{script}")
    gateway = start_gateway(env, tmp_path / "gateway")
    try:
        wait_until(lambda: counts(db, batch_id).completed == 12, 120, "the rest of the lines")
    finally:
        gateway.stop()
    collected = subprocess.run(
        [sys.executable, "-m", "parley", "--db", db, "batch", "results", batch_id],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=shell_env(),
    )  # fmt: skip
    assert collected.returncode == 0 and collected.stderr == "", collected.stderr
    assert sorted(json.loads(row)["custom_id"] for row in collected.stdout.splitlines()) == sorted(
        f"l{n}" for n in range(12)
    )


def test_ctrl_c_twice_leaves_the_running_lines_and_connect_with_a_host_resumes_them(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    script = tmp_path / "slow.json"
    script.write_text(json.dumps(slow(chunks=60, delay_ms=200)))  # twelve seconds a line
    with submitting(tmp_path, db, script, count=5, window=2) as (process, batch_id):
        assert process.stderr is not None
        wait_until(lambda: counts(db, batch_id).running == 2, 60, "two lines running")
        process.send_signal(signal.SIGINT)
        seen: list[str] = []
        while not (line := process.stderr.readline()).startswith("stopping:"):
            assert line, seen
            seen.append(line)
        assert "the 2 lines running finish first (Ctrl-C again leaves them" in line
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    [said] = err.splitlines()
    assert said.startswith(f"batch {batch_id}: 5 of 5 lines left; the next process")
    left = counts(db, batch_id)
    assert (left.running, left.queued) == (2, 3)  # (the two as their process left them)

    host = parley.Host(model=ScriptedModel(FAST))
    with parley.connect(db, host=host) as client:
        batch = client.batch(batch_id)
        rows = list(batch.results(timeout=120))
        assert batch.status().request_counts == {"total": 5, "completed": 5, "failed": 0}
        lines = client.store.batch_lines(batch_id, None, 0, 10)
        attempts = sorted(client.store.run_state(line.turn_id or "").attempts for line in lines)
    assert attempts == [1, 1, 1, 2, 2]  # the two left mid-step, resumed
    assert sorted(r["response"]["body"]["output_text"] for r in rows) == [
        f"done: line {n}" for n in range(5)
    ]


def test_a_process_with_a_host_leaves_a_running_submissions_queued_lines_to_it(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    script = tmp_path / "slow.json"
    script.write_text(json.dumps(slow(chunks=5, delay_ms=200)))
    with submitting(tmp_path, db, script, count=15, window=1) as (process, batch_id):
        wait_until(lambda: counts(db, batch_id).completed >= 1, 60, "a line's end")
        host = parley.Host(model=ScriptedModel(FAST))
        with parley.connect(db, host=host):
            # Long enough for its sweep to see the queued lines twice, and adopt them if
            # it took what a live process runs.
            time.sleep(3 * SWEEP_SECONDS)
        assert counts(db, batch_id).queued > 0  # there were lines to take all along
        _out, err = process.communicate(timeout=120)
        submitter = process.pid
    assert process.returncode == 0, err
    with parley.connect(db) as reader:
        lines = reader.store.batch_lines(batch_id, None, 0, 20)
        drivers = {reader.store.run_state(line.turn_id or "").worker for line in lines}
    assert {worker.split(":")[1] for worker in drivers if worker} == {str(submitter)}
