"""The command line as a new user meets it, with the real ``parley`` command: every
command that runs turns works with no host named (the offline scripted agent, said once
on stderr), the global options go after the command too, a reader that closes the pipe
ends any command quietly, output to a pipe never wraps, and a provider out of reach is
one line, not a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import parley
from parley.cli.connecting import OFFLINE_NOTICE
from parley.cli.output import CLOSED_PIPE_STATUS
from tests.support.gateway import start_gateway

OFFLINE_REPLY = "(scripted, offline) You said: "


def new_user_env(**extra: str) -> dict[str, str]:
    """A shell with nothing of parley's set, and no terminal width (rich's default,
    80 columns, is what a pipe had)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    env.pop("COLUMNS", None)
    return {**env, **extra}


def parley_cli(
    *argv: str, cwd: Path, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parley", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env or new_user_env(),
        check=False,
    )


def write_lines(path: Path, count: int) -> Path:
    line = {"method": "POST", "url": "/v1/responses"}
    rows = [{**line, "custom_id": f"l{n}", "body": {"input": f"line {n}"}} for n in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_every_command_that_runs_turns_falls_back_to_the_offline_agent_and_says_so_once(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'new.db'}"
    # The global options after the command, as a newcomer types them.
    created = parley_cli("new", str(tmp_path), "--db", db, cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    session_id = created.stdout.strip()
    assert created.stderr == ""  # it runs no turn: no word of a model

    submitted = parley_cli("submit", session_id, "hello", "--db", db, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    assert OFFLINE_REPLY + "hello" in submitted.stdout
    assert submitted.stderr.splitlines() == [OFFLINE_NOTICE]

    source = write_lines(tmp_path / "tickets.jsonl", 3)
    batch = parley_cli(
        "batch", "submit", str(source), "--root", str(tmp_path), "--db", db, cwd=tmp_path
    )
    assert batch.returncode == 0, batch.stderr
    assert batch.stderr.splitlines()[0] == OFFLINE_NOTICE
    assert batch.stderr.count(OFFLINE_NOTICE) == 1
    with parley.connect(db) as client:
        rows = list(client.batch(batch.stdout.splitlines()[0]).output())
    assert sorted(r["response"]["body"]["output_text"] for r in rows) == [
        OFFLINE_REPLY + f"line {n}" for n in range(3)
    ]

    chat = parley_cli("chat", "--db", db, "--root", str(tmp_path), cwd=tmp_path, stdin="hi\n")
    assert chat.returncode == 0, chat.stderr
    assert OFFLINE_REPLY + "hi" in chat.stdout and chat.stderr.count(OFFLINE_NOTICE) == 1

    # A model named: no word of the offline agent.
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [{"when": ".", "steps": [{"text": "real"}]}]}))
    named = new_user_env(PARLEY_MODEL=f"scripted:{script}")
    real = parley_cli("submit", session_id, "again", "--db", db, cwd=tmp_path, env=named)
    assert real.returncode == 0 and "real" in real.stdout and real.stderr == "", real.stderr


def test_an_offline_gateway_says_so_once_on_stderr(tmp_path: Path) -> None:
    env = new_user_env(PARLEY_DATABASE_URL=f"sqlite:///{tmp_path / 'g.db'}")
    gateway = start_gateway(env, tmp_path / "gateway")
    try:
        out = gateway.stdout.read_text()
        err = gateway.stderr.read_text()
    finally:
        gateway.stop()
    assert err.count(OFFLINE_NOTICE) == 1 and err.splitlines()[0] == OFFLINE_NOTICE
    assert "offline script" not in out  # the announcement on stdout: where to open the page

    # Logging JSON, its stderr stays JSON lines: the notice is one of them.
    env["PARLEY_LOG_FORMAT"] = "json"
    gateway = start_gateway(env, tmp_path / "json")
    try:
        lines = [json.loads(line) for line in gateway.stderr.read_text().splitlines()]
    finally:
        gateway.stop()
    told = [line for line in lines if line["message"] == OFFLINE_NOTICE]
    assert len(told) == 1 and told[0]["level"] == "WARNING"


def test_a_reader_that_closes_the_pipe_ends_any_command_quietly(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'pipe.db'}"
    session_id = parley_cli("--db", db, "new", str(tmp_path), cwd=tmp_path).stdout.strip()
    source = write_lines(tmp_path / "in.jsonl", 3)
    submitted = parley_cli("--db", db, "batch", "submit", str(source), "--root", str(tmp_path),
                           cwd=tmp_path)  # fmt: skip
    batch_id = submitted.stdout.splitlines()[0]
    turn = parley_cli("--db", db, "submit", session_id, "hi", cwd=tmp_path)
    turn_id = turn.stdout.strip().splitlines()[-1].split()[-1]
    for command in (
        ["batch", "results", batch_id],
        ["batch", "list"],
        ["batch", "status", "--json", batch_id],
        ["history", session_id],
        ["tree", session_id],
        ["follow", turn_id],
        ["status", "--json"],
    ):
        with subprocess.Popen(
            [sys.executable, "-m", "parley", "--db", db, *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env=new_user_env(),
        ) as process:
            assert process.stdout is not None and process.stderr is not None
            process.stdout.close()  # the reader is gone before the first line: `| head -0`
            err = process.stderr.read().decode()
            assert process.wait(60) == CLOSED_PIPE_STATUS, (command, err)
        assert err == "", (command, err)


def test_output_to_a_pipe_never_wraps(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'wide.db'}"
    session_id = parley_cli("--db", db, "new", str(tmp_path), cwd=tmp_path).stdout.strip()
    prompt = "please look at " + " ".join(f"item-{n:02d}" for n in range(20))
    assert parley_cli("--db", db, "submit", session_id, prompt, cwd=tmp_path).returncode == 0
    history = parley_cli("--db", db, "history", session_id, cwd=tmp_path).stdout
    [line] = history.splitlines()
    assert prompt in line and len(line) > 200
    tree = parley_cli("--db", db, "tree", session_id, cwd=tmp_path).stdout.splitlines()
    assert len(tree) == 2 and prompt in tree[1]
    source = write_lines(tmp_path / "in.jsonl", 1)
    batch_id = parley_cli("--db", db, "batch", "submit", str(source), "--root", str(tmp_path),
                          cwd=tmp_path).stdout.splitlines()[0]  # fmt: skip
    status = parley_cli("--db", db, "batch", "status", batch_id, cwd=tmp_path).stdout
    files = next(line for line in status.splitlines() if line.startswith("  output "))
    assert files.count("file-") == 2 and len(files) > 80


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_provider_out_of_reach_is_one_line_not_a_traceback(
    tmp_path: Path, closed_port: int
) -> None:
    db = f"sqlite:///{tmp_path / 'away.db'}"
    session_id = parley_cli("--db", db, "new", str(tmp_path), cwd=tmp_path).stdout.strip()
    env = new_user_env(
        PARLEY_MODEL="openai:gpt-4o-mini",
        OPENAI_API_KEY="sk-test-not-a-key",
        OPENAI_BASE_URL=f"http://127.0.0.1:{closed_port}/v1",
    )
    turn = parley_cli("--db", db, "submit", session_id, "hello", cwd=tmp_path, env=env)
    assert turn.returncode == 1
    assert "model failed: ProviderError" in turn.stdout and "cannot connect" in turn.stdout
    assert "Traceback" not in turn.stderr and "File " not in turn.stderr, turn.stderr
    assert all("ProviderError" in line or "openai:gpt-4o-mini" in line
               for line in turn.stderr.splitlines()), turn.stderr  # fmt: skip
