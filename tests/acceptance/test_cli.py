"""The command line as a user runs it: the demo, and the commands it relies on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from parley import TurnStatus, connect
from parley.cli import UNCLAIMED_NOTICE_SECONDS
from tests.conftest import fresh_postgres_database
from tests.fleet import REDIS_TEST_URL


def parley(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parley", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_the_demo_tells_the_whole_story_and_exits_0(tmp_path: Path) -> None:
    # Offline even where a fleet's Redis is configured (here, a port nothing listens on),
    # and a directory name is text, not terminal markup.
    tmp_path = tmp_path / "demo [/] [red]dir"
    run = parley("demo", "--dir", str(tmp_path), env={"PARLEY_REDIS_URL": "redis://127.0.0.1:9/0"})
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

    history = parley("history", session_id, env=env).stdout
    assert history.startswith(turn_id) and "hello there" in history  # an id to copy whole
    assert "◀ head" in parley("tree", session_id, env=env).stdout
    followed = parley("follow", turn_id, env=env).stdout
    # After the end a reader gets no tokens: the reply comes from the committed step.
    assert "heard: hello there" in followed and "finished" in followed

    missing = parley("history", "00000000-0000-0000-0000-000000000000", env=env)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.startswith("SessionNotFound:") and missing.stderr.count("\n") == 1
    empty = parley("submit", session_id, "   ", env=env)
    assert empty.returncode == 2 and "InvalidRequest" in empty.stderr
    assert "you:" not in empty.stdout  # nothing echoed for a prompt that was refused
    assert len(parley("history", session_id, env=env).stdout.strip().splitlines()) == 1

    # Text in brackets is text, not terminal markup: in a prompt, a reply, an error.
    bracketed = parley("submit", session_id, "fix [/] this [red]now", env=env)
    assert bracketed.returncode == 0, bracketed.stderr
    assert "heard: fix [/] this [red]now" in bracketed.stdout
    odd = parley("history", "x[/]", env=env)
    assert odd.returncode == 2 and "x[/]" in odd.stderr and "Traceback" not in odd.stderr

    assert parley("new", "", env=env).returncode == 2
    typo = tmp_path / "typo.db"
    absent = parley("--db", f"sqlite:///{typo}", "history", session_id)
    assert absent.returncode == 2 and "no database at" in absent.stderr
    assert not typo.exists()  # a read never creates a database
    assert parley("--db", f"sqlite:///{typo}", "submit", session_id, "hi").returncode == 2
    assert not typo.exists()

    # An explicit --model wins over an exported PARLEY_HOST (end of input quits the chat).
    chat = parley("chat", "--model", f"scripted:{script}", env=env)
    assert chat.returncode == 0, chat.stderr

    (tmp_path / "explodes.py").write_text("raise RuntimeError('no config file')\n")
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    broken = parley(
        "--host", "explodes:host", "submit", session_id, "hi", env={**env, "PYTHONPATH": path}
    )
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert "importing explodes failed: RuntimeError: no config file" in broken.stderr


def test_ctrl_c_on_submit_interrupts_the_turn(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    slow = {"text": "word " * 100, "chunk_chars": 5, "delay_ms": 50}  # some 5 s of tokens
    script.write_text(json.dumps({"rules": [{"when": ".*", "steps": [slow]}]}))
    env = {
        **os.environ,
        "COLUMNS": "200",
        "PYTHONUNBUFFERED": "1",
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "PARLEY_HOST": f"scripted:{script}",
    }
    session_id = parley("new", str(tmp_path), env=env).stdout.strip()
    with subprocess.Popen(
        [sys.executable, "-m", "parley", "submit", session_id, "talk slowly"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.read(len("you:")) == "you:"
        assert process.stdout.read(1)  # the turn is under way
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 1, err
    # It did not wait for the whole answer (counted in words, not seconds: a loaded
    # machine may start the process slowly, but cannot make it stream faster).
    assert out.count("word") < 100
    assert "interrupting" in out and "cancelled" in out
    turn_id = out.strip().splitlines()[-1].split()[-1]
    assert f"parley resume {turn_id}" in out
    assert "cancelled" in parley("follow", turn_id, env=env).stdout

    slow["delay_ms"] = 0
    script.write_text(json.dumps({"rules": [{"when": ".*", "steps": [slow]}]}))
    resumed = parley("resume", turn_id, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "word word" in resumed.stdout and "finished" in resumed.stdout
    assert "cancelled" not in resumed.stdout  # only the resumed attempt is shown
    assert parley("resume", turn_id, env=env).returncode == 2  # a finished turn is not resumable


@pytest.mark.postgres
@pytest.mark.slow
def test_submit_with_no_worker_says_once_that_the_turn_waits_for_one(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [{"when": ".*", "steps": [{"text": "hi"}]}]}))
    with fresh_postgres_database("cli") as url:
        env = {
            **os.environ,
            "COLUMNS": "200",
            "PARLEY_DATABASE_URL": url,
            "PARLEY_REDIS_URL": REDIS_TEST_URL,
            "PARLEY_QUEUE": f"parley.test.{uuid.uuid4().hex[:8]}",  # that no worker serves
            "PARLEY_HOST": f"scripted:{script}",
        }
        session_id = parley("new", str(tmp_path), env=env).stdout.strip()
        with subprocess.Popen(
            [sys.executable, "-m", "parley", "submit", session_id, "anyone?"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        ) as process:
            time.sleep(UNCLAIMED_NOTICE_SECONDS + 3)
            assert process.poll() is None  # still waiting, as it should
            process.terminate()
            _, err = process.communicate(timeout=30)
        with connect(url, redis_url=REDIS_TEST_URL) as client:
            [turn] = client.session(session_id).tree()
        assert turn.status is TurnStatus.QUEUED
    [notice] = err.splitlines()
    assert notice == (
        f"turn {turn.turn_id} is queued and no worker has taken it in "
        f"{UNCLAIMED_NOTICE_SECONDS:g} s: is `parley worker` running?"
    )


def test_approve_lists_and_answers_a_waiting_call_from_another_process(tmp_path: Path) -> None:
    """``parley submit`` waits while its turn's call waits for a person; ``parley approve``
    lists the call in another process, answers it, and (embedded, with the host) runs the
    turn on: the write happens once and the first process sees the end."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    write = {"name": "write_file", "arguments": {"path": "notes.md", "content": "hi\n"}}
    script = {"rules": [{"when": ".*", "steps": [{"tool_calls": [write]}, {"text": "written"}]}]}
    (tmp_path / "script.json").write_text(json.dumps(script))
    (tmp_path / "asking.py").write_text(
        "import parley\n"
        f"host = parley.Host(model=parley.models.ScriptedModel({str(tmp_path / 'script.json')!r}),"
        " policy=parley.Policy(ask_write=['**']))\n"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "PARLEY_HOST": "asking:host",
        "PYTHONPATH": path,
    }
    session_id = parley("new", str(workspace), env=env).stdout.strip()
    submit = subprocess.Popen(
        [sys.executable, "-m", "parley", "submit", session_id, "write the notes"],
        env={**os.environ, "COLUMNS": "200", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with connect(env["PARLEY_DATABASE_URL"]) as client:
            deadline = time.monotonic() + 30
            while True:
                tree = client.session(session_id).tree()
                if tree and tree[0].status is TurnStatus.WAITING:
                    break
                assert time.monotonic() < deadline, "the turn never waited"
                time.sleep(0.1)
        turn_id = tree[0].turn_id
        assert not (workspace / "notes.md").exists()
        listed = parley("approve", turn_id, env=env)
        assert listed.returncode == 0, listed.stderr
        approval_id = listed.stdout.split()[0]
        assert "[waiting]" in listed.stdout and "write_file" in listed.stdout
        approved = parley("approve", turn_id, approval_id, env=env)
        assert approved.returncode == 0, approved.stderr
        assert "[approved]" in approved.stdout and "finished" in approved.stdout
        again = parley("approve", turn_id, approval_id, "--deny", "too late", env=env)
        assert again.returncode == 2 and again.stderr.startswith("Conflict:")
        out, err = submit.communicate(timeout=60)
        assert submit.returncode == 0, err
        assert "waiting for an answer" in out and "written" in out
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.communicate()
    assert (workspace / "notes.md").read_text() == "hi\n"
