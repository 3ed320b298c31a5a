"""The command line as a user runs it: the demo, and the commands it relies on."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from parley import Client, TurnStatus, connect
from parley.cli.watching import UNCLAIMED_NOTICE_SECONDS
from tests.acceptance.conftest import ClientFactory
from tests.support.chaos import chaos_fleet
from tests.support.databases import fresh_postgres_database
from tests.support.deployments import ALL, on_deployments
from tests.support.fleet import REDIS_TEST_URL
from tests.support.helpers import Control
from tests.support.processes import as_from_a_terminal

pytestmark = on_deployments(*ALL)


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


@contextmanager
def parley_client(env: dict[str, str]) -> Iterator[Client]:
    """A client of the database ``env`` names (to read what the commands stored)."""
    client = connect(env["PARLEY_DATABASE_URL"])
    try:
        yield client
    finally:
        client.close()


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

    batch = parley("submit", session_id, "a batch line", "--priority", "batch", env=env)
    assert batch.returncode == 0 and "heard: a batch line" in batch.stdout, batch.stderr
    batch_id = batch.stdout.strip().splitlines()[-1].split()[-1]
    with parley_client(env) as client:
        assert client.store.run_state(batch_id).priority == "batch"
        assert client.store.run_state(turn_id).priority == "interactive"

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
    assert len(parley("history", session_id, env=env).stdout.strip().splitlines()) == 2
    # A compaction is marked after the newest turn it covers.
    with parley_client(env) as client:
        made = client.session(session_id).compact(strategy="trim", keep_turns=1)
    marked = parley("history", session_id, env=env).stdout.strip().splitlines()
    assert len(marked) == 3 and marked[0].startswith(turn_id)
    assert marked[1].startswith("── compacted [trim]") and "(applies)" in marked[1]
    assert marked[1].endswith(made.compaction_id)

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


def test_submit_after_or_at_waits_for_the_time_then_prints_the_turn(tmp_path: Path) -> None:
    """``parley submit --after SECONDS`` / ``--at TIME`` (docs/time.md): the turn is
    stored delayed, the command says until when, and prints the turn once it ran; a time
    without its offset, a bad one, or both options are refused and store nothing."""
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps({"rules": [{"when": ".*", "steps": [{"text": "heard: {prompt}"}]}]})
    )
    env = {
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "PARLEY_HOST": f"scripted:{script}",
    }
    session_id = parley("new", str(tmp_path), env=env).stdout.strip()
    began = datetime.now(UTC)
    later = parley("submit", session_id, "later", "--after", "2", env=env)
    assert later.returncode == 0, later.stderr
    assert "waiting until 20" in later.stdout and "heard: later" in later.stdout
    assert datetime.now(UTC) - began >= timedelta(seconds=2)
    at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    timed = parley("submit", session_id, "at a time", "--at", at, env=env)
    assert timed.returncode == 0 and "heard: at a time" in timed.stdout, timed.stderr

    for bad in (
        ("--at", "2030-01-01T09:00:00"),
        ("--at", "tomorrow"),
        ("--after", "-5"),
    ):
        refused = parley("submit", session_id, "never", *bad, env=env)
        assert refused.returncode == 2 and "InvalidRequest" in refused.stderr, refused
    both = parley("submit", session_id, "never", "--at", at, "--after", "1", env=env)
    assert both.returncode == 2 and "not allowed with" in both.stderr, both.stderr
    assert len(parley("history", session_id, env=env).stdout.strip().splitlines()) == 2


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
        preexec_fn=as_from_a_terminal,
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


def test_submit_on_a_fleet_needs_no_host_the_workers_hold_it(workspace: Path) -> None:
    with chaos_fleet(workspace, pool="threads", workers=1) as chaos:
        chaos.control.script([{"when": ".*", "steps": [{"text": "the worker heard: {prompt}"}]}])
        env = {
            k: v for k, v in chaos.fleet.env().items() if k not in ("PARLEY_HOST", "PARLEY_MODEL")
        }
        session_id = chaos.client.open_session(chaos.workspace).id
        turn = parley("submit", session_id, "hello fleet", env=env)
    assert turn.returncode == 0, turn.stderr
    assert "the worker heard: hello fleet" in turn.stdout
    assert "no host" not in turn.stderr


def test_status_and_beat_on_an_unmigrated_database_say_so_on_one_line(tmp_path: Path) -> None:
    with fresh_postgres_database("unmigrated", migrated=False) as url:
        env = {
            "PARLEY_DATABASE_URL": url,
            "PARLEY_REDIS_URL": REDIS_TEST_URL,
            "PARLEY_QUEUE": f"parley.test.{uuid.uuid4().hex[:8]}",
        }
        status = parley("status", env=env)
        embedded = parley("status", env={**env, "PARLEY_REDIS_URL": ""})
        beat = parley("beat", env=env)
    expected = f"StoreError: the database at {url} is not migrated: run `parley migrate`"
    for run in (status, embedded):
        assert (run.returncode, run.stdout, run.stderr.splitlines()) == (2, "", [expected])
    # beat stops at once (every sweep would fail) rather than log the SQL error every 2 s;
    # its lines before the error are the start every beat logs (and its runtime built).
    assert beat.returncode == 2
    started, *between, error = beat.stderr.splitlines()
    assert "parley.worker sweeping every" in started and error == expected
    assert all(re.search(r" parley.worker process \d+ built its runtime ", b) for b in between)
    assert len(between) <= 1


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


def test_signal_wakes_a_waiting_turn_from_another_process(tmp_path: Path) -> None:
    """``parley submit`` waits while its turn's call waits for an event; ``parley signal``
    sends it from another process (docs/time.md#waiting-for-an-event), refusing a payload
    that is not JSON, and (embedded, with the host) runs the turn on; a signal to the
    ended turn is refused."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    wait = {"name": "wait", "arguments": {"event": "go"}}
    Control(workspace).script(
        [{"when": ".*", "steps": [{"tool_calls": [wait]}, {"text": "went on"}]}]
    )
    repo = str(Path(__file__).parents[2])
    env = {
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "PARLEY_HOST": "tests.support.hosts:waiting_host",
        "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
    }
    session_id = parley("new", str(workspace), env=env).stdout.strip()
    submit = subprocess.Popen(
        [sys.executable, "-m", "parley", "submit", session_id, "wait for the go"],
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
        bad = parley("signal", turn_id, "go", "{not json", env=env)
        assert bad.returncode == 2 and bad.stderr.startswith("InvalidRequest:"), bad.stderr
        sent = parley("signal", turn_id, "go", '{"ok": true}', env=env)
        assert sent.returncode == 0, sent.stderr
        assert "delivered" in sent.stdout and "finished" in sent.stdout
        out, err = submit.communicate(timeout=60)
        assert submit.returncode == 0, err
        assert "waiting for event go" in out and "went on" in out
        late = parley("signal", turn_id, "go", env=env)
        assert late.returncode == 2 and late.stderr.startswith("TurnEnded:"), late.stderr
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.communicate()


def parley_reading(
    *argv: str, stdin: str | bytes, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``parley ARGV`` with ``stdin`` on its standard input."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    run = subprocess.run(
        [sys.executable, "-m", "parley", *argv],
        capture_output=True,
        input=data,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **env},
        check=False,
    )
    return subprocess.CompletedProcess(
        run.args, run.returncode, run.stdout.decode(), run.stderr.decode()
    )


UNKNOWN_TURN = "00000000-0000-0000-0000-000000000000"


def test_say_and_interrupt_steer_a_running_turn_from_another_process(
    make_client: ClientFactory,
    control: Control,
    workspace: Path,
    db_url: str,
    subprocess_env: dict[str, str],
) -> None:
    gate = {"tool_calls": [{"name": "wait_for_gate"}]}
    client = make_client(
        [
            {"when": "steer me", "steps": [gate, {"text": "heard: {last_message}"}]},
            {"when": "stop me", "steps": [gate, {"text": "not reached"}]},
        ]
    )
    env = {**subprocess_env, "PARLEY_DATABASE_URL": db_url}
    session = client.open_session(workspace)
    steered = session.submit("steer me")
    control.wait_entered()
    said = parley("say", steered.turn_id, "only the [docs]", env=env)
    assert said.returncode == 0, said.stderr
    assert said.stdout.startswith("steer 1 accepted")
    control.open_gate()
    result = steered.wait(60)
    assert result.reply == "heard: only the [docs]"
    worker = client.store.run_state(steered.turn_id).worker
    followed = parley("follow", steered.turn_id, env=env)
    assert followed.returncode == 0, followed.stderr
    # Who ran it (host:pid:thread, as the run stores it), and what it heard.
    assert f"worker {worker} took it (attempt 1)" in followed.stdout
    assert "steer delivered: only the [docs]" in followed.stdout

    control.reset_gate()
    stopped = session.submit("stop me")
    control.wait_entered()
    interrupted = parley("interrupt", stopped.turn_id, env=env)
    assert interrupted.returncode == 0, interrupted.stderr
    assert interrupted.stdout.startswith("interrupt accepted")
    assert f"parley resume {stopped.turn_id}" in interrupted.stdout
    control.open_gate()
    assert stopped.wait(60).outcome is TurnStatus.CANCELLED

    # An ended turn takes no steer, an unknown one is not found: one line, exit 2, and
    # nothing stored.
    before = [len(client.store.pending_steers(h.run_id, 0)) for h in (steered, stopped)]
    late = parley("say", steered.turn_id, "too late", env=env)
    # (its own error is its last line: on the run's shared PostgreSQL database the
    # command's client may also go on with a turn another test left, and log about it)
    assert late.returncode == 2 and last_line(late.stderr).startswith("TurnEnded:"), late.stderr
    assert late.stdout == ""
    if db_url.startswith("sqlite"):  # this test's own database: nothing else to log about
        assert late.stderr.count("\n") == 1, late.stderr
    again = parley("interrupt", stopped.turn_id, env=env)
    assert again.returncode == 2 and last_line(again.stderr).startswith("TurnEnded:"), again.stderr
    for command in (("say", UNKNOWN_TURN, "hello"), ("interrupt", UNKNOWN_TURN)):
        unknown = parley(*command, env=env)
        assert unknown.returncode == 2, unknown.stderr
        assert last_line(unknown.stderr).startswith("TurnNotFound:"), unknown.stderr
    after = [len(client.store.pending_steers(h.run_id, 0)) for h in (steered, stopped)]
    assert after == before


def test_a_prompt_comes_from_a_file_or_stdin_and_bad_input_changes_nothing(
    tmp_path: Path,
) -> None:
    script = tmp_path / "script.json"
    rules = [
        {"when": "^BIG", "steps": [{"text": "read the big one"}]},
        {"when": ".*", "steps": [{"text": "heard: {prompt}"}]},
    ]
    script.write_text(json.dumps({"rules": rules}))
    env = {
        "PARLEY_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}",
        "PARLEY_HOST": f"scripted:{script}",
    }
    session_id = parley("new", str(tmp_path), env=env).stdout.strip()
    big = tmp_path / "prompt.md"
    text = "BIG review this:\n" + "".join(f"line {n}: [x] `code`\n" for n in range(20_000))
    big.write_text(text)
    from_file = parley("submit", session_id, "--prompt-file", str(big), env=env)
    assert from_file.returncode == 0, from_file.stderr
    assert "read the big one" in from_file.stdout
    first = from_file.stdout.splitlines()[0]  # the echo: its first line, and its size
    assert first == f"you: BIG review this:  ({len(text)} characters from {big})"
    piped = parley_reading("submit", session_id, "-", stdin="from a pipe", env=env)
    assert piped.returncode == 0, piped.stderr
    assert "heard: from a pipe" in piped.stdout and "characters from stdin" in piped.stdout
    also = parley_reading("submit", session_id, "--prompt-file", "-", stdin="again", env=env)
    assert also.returncode == 0 and "heard: again" in also.stdout, also.stderr
    with connect(env["PARLEY_DATABASE_URL"]) as client:
        prompts = [t.prompt for t in client.session(session_id).history()]
    assert prompts == [text, "from a pipe", "again"]  # as read, byte for byte
    turn_id = from_file.stdout.strip().splitlines()[-1].split()[-1]

    missing = tmp_path / "missing.md"
    (tmp_path / "binary.bin").write_bytes(b"\xff\xfe not text")
    refused = {
        "no such file": parley("submit", session_id, "--prompt-file", str(missing), env=env),
        "a directory": parley("submit", session_id, "--prompt-file", str(tmp_path), env=env),
        "not UTF-8": parley(
            "submit", session_id, "--prompt-file", str(tmp_path / "binary.bin"), env=env
        ),
        "empty stdin": parley_reading("submit", session_id, "-", stdin="", env=env),
        "blank stdin": parley_reading("submit", session_id, "-", stdin=" \n\n", env=env),
        "both": parley("submit", session_id, "hi", "--prompt-file", str(big), env=env),
        "neither": parley("submit", session_id, env=env),
        "say, no file": parley("say", turn_id, "--text-file", str(missing), env=env),
        "say, empty": parley_reading("say", turn_id, "-", stdin="", env=env),
    }
    for why, run in refused.items():
        assert run.returncode == 2, (why, run.stderr)
        assert run.stderr.startswith("InvalidRequest: ") and run.stderr.count("\n") == 1, why
        assert "you:" not in run.stdout and "Traceback" not in run.stderr, why
    assert f"cannot read the prompt from {missing}: No such file or directory" in (
        refused["no such file"].stderr
    )
    assert "the prompt from stdin is empty" in refused["empty stdin"].stderr
    assert "the message from stdin is empty" in refused["say, empty"].stderr
    with connect(env["PARLEY_DATABASE_URL"]) as client:
        assert len(client.session(session_id).tree()) == 3


@pytest.mark.postgres
@pytest.mark.slow
def test_follow_names_the_worker_of_a_turn_and_the_one_that_takes_it_over(
    workspace: Path,
) -> None:
    with chaos_fleet(workspace, pool="threads") as chaos:
        gate = {"tool_calls": [{"name": "wait_for_gate"}]}
        chaos.control.script([{"when": ".*", "steps": [gate, {"text": "done"}]}])
        handle = chaos.client.open_session(chaos.workspace).submit("crash while I watch")
        env = {k: v for k, v in chaos.fleet.env().items() if k != "PARLEY_HOST"}
        with subprocess.Popen(
            [sys.executable, "-m", "parley", "follow", handle.turn_id],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "COLUMNS": "200"},
        ) as follower:
            chaos.control.wait_entered()
            first = chaos.client.store.run_state(handle.turn_id).worker
            victim = chaos.driver_pid(handle.turn_id)
            os.killpg(chaos.worker_group_of(victim), signal.SIGKILL)
            chaos.control.open_gate()
            assert handle.wait(60).reply == "done"
            out, err = follower.communicate(timeout=30)
        assert follower.returncode == 0, err
        second = chaos.client.store.run_state(handle.turn_id).worker
    assert first and second and first != second
    took = out.index(f"worker {first} took it (attempt 1)")
    assert took < out.index(f"worker {second} took it over from {first} (attempt 2)")


def last_line(text: str) -> str:
    """The last line of ``text`` ("" if none)."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""
