"""``parley chat`` driven in a real terminal (tmux): tokens live, a typed line steers the
running turn, Ctrl-C interrupts it and a second Ctrl-C quits, ``/resume``, ``/history``,
``/branch N``, ``/tree``, and a second process reopens the conversation by its id."""

from __future__ import annotations

import re
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

import parley
from tests.providers.servers import Reply, openai_server, openai_text
from tests.support.terminal import Terminal

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

PARLEY = str(Path(sys.executable).parent / "parley")


def test_a_conversation_in_the_terminal(tmp_path: Path, terminals: list[Terminal]) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello\n")
    db = f"sqlite:///{tmp_path / 'chat.db'}"
    socket = f"parley-test-{uuid.uuid4().hex[:8]}"
    chat = [PARLEY, "--db", db, "chat", "--root", str(workspace)]
    term = Terminal(socket, chat, tmp_path)
    terminals.append(term)

    screen = term.wait_for(r"(?m)^you>")
    session_id = re.search(r"session ([0-9a-f-]{36})", screen).group(1)  # type: ignore[union-attr]

    # A plain turn: its tokens arrive and it finishes.
    term.type("hello there")
    term.wait_for(r"You said: hello there")
    term.wait_for(r"■ finished", 1)

    # A line typed while the agent works is a steer, delivered at the next step.
    term.type("tell me a long story")
    term.wait_for(r"Here is a long story")
    term.type("make it about cats")
    term.wait_for(r"steer sent")
    term.wait_for(r"steer delivered: make it about cats")
    term.wait_for(r'Latest word from you: "make it about cats"')
    term.wait_for(r"■ finished", 2)

    # Ctrl-C interrupts the running turn; the chat stays; /resume continues the turn.
    term.type("another long story please")
    term.wait_for(r"Here is a long story", 2)
    term.ctrl_c()
    term.wait_for(r"interrupting")
    term.wait_for(r"■ cancelled")
    term.type("/resume")
    term.wait_for(r"resuming")
    screen = term.wait_for(r"■ finished", 3)
    # The resumed attempt is followed from where the screen was: nothing shown twice.
    assert len(re.findall(r"■ cancelled", screen)) == 1
    # Only the newest turn can be resumed: an older one would pull the head back.
    term.type("/resume")
    term.wait_for(r"nothing to resume \(the last turn finished\)")

    # /history numbers the turns; /branch 1 makes the next message follow turn 1.
    term.type("/history")
    term.wait_for(r"  3 .*another long story please")
    term.type("/branch 1")
    term.wait_for(r"branched: the next message follows turn 1")
    term.type("after the branch")
    term.wait_for(r"You said: after the branch")
    term.wait_for(r"■ finished", 4)
    term.type("/tree")
    term.wait_for(r"session " + session_id)

    # Ctrl-C with nothing running quits.
    term.ctrl_c()
    term.wait_for(r"bye")
    term.wait_for(r"\[exited\]")

    with parley.connect(db) as client:
        history = client.session(session_id).history()
        assert [t.prompt for t in history] == ["hello there", "after the branch"]
        assert len(client.session(session_id).tree()) == 4

    # Another process reopens the conversation by its id and carries on.
    again = Terminal(socket, [PARLEY, "--db", db, "chat", session_id], tmp_path)
    terminals.append(again)
    again.wait_for(r"session " + session_id)
    again.type("/history")
    again.wait_for(r"  2 .*after the branch")
    again.type("still there?")
    again.wait_for(r"You said: still there\?")
    again.wait_for(r"■ finished")
    again.type("/quit")
    again.wait_for(r"\[exited\]")


def test_what_is_typed_while_the_reply_streams_stays_on_its_own_line(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    """The person types a steer while the reply streams: the input line keeps what is
    typed, below the streamed line; the reply is never broken by the typing; the events
    are shown by what they say, with no bare numbers."""
    db = f"sqlite:///{tmp_path / 'chat.db'}"
    socket = f"parley-test-{uuid.uuid4().hex[:8]}"
    term = Terminal(socket, [PARLEY, "--db", db, "chat", "--root", str(tmp_path)], tmp_path)
    terminals.append(term)
    term.wait_for(r"(?m)^you>")
    term.type("tell me a long story")
    term.wait_for(r"Here is a long")
    # Slowly, a key at a time, as a person types while the tokens arrive.
    for key in "make it about cats":
        term.keys(key)
        time.sleep(0.03)
    screen = term.wait_for(r"(?m)^you> make it about cats$")
    assert "make it" not in screen.replace("you> make it about cats", "")
    term.type("")  # Enter: the steer
    term.wait_for(r"steer sent")
    term.wait_for(r"steer delivered: make it about cats")
    screen = term.wait_for(r"■ finished")
    lines = screen.splitlines()
    # Each step's text on one line, whole, as it streamed (tmux joins what it wrapped).
    first = "agent> Here is a long story, told slowly so there is time to steer or interrupt me."
    assert any(line.startswith(first) for line in lines), screen
    second = 'Latest word from you: "make it about cats". Once upon a time there was a worker'
    assert any(line.startswith(second) for line in lines), screen
    assert re.search(r"(?m)^→ list_files", screen), screen
    assert re.search(r"(?m)^■ finished$", screen), screen
    assert not re.search(r"(?m)^\s*\d+\s", screen), screen  # no bare event numbers
    term.type("/quit")
    term.wait_for(r"\[exited\]")


def test_a_second_ctrl_c_quits_while_the_turn_is_being_interrupted(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    db = f"sqlite:///{tmp_path / 'chat.db'}"
    socket = f"parley-test-{uuid.uuid4().hex[:8]}"
    term = Terminal(socket, [PARLEY, "--db", db, "chat", "--root", str(tmp_path)], tmp_path)
    terminals.append(term)
    term.wait_for(r"(?m)^you>")
    term.type("a long story")
    term.wait_for(r"Here is a long story")
    term.ctrl_c()
    term.wait_for(r"interrupting")
    term.ctrl_c()
    term.wait_for(r"bye")
    term.wait_for(r"\[exited\]")


def test_chat_streams_from_a_real_provider_protocol(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    """``--model openai:…`` against an OpenAI-compatible server on loopback: the key and
    the endpoint come from the environment, tokens appear as the server streams them."""
    with openai_server() as server:
        server.plan(Reply(frames=openai_text("Hello ", "from ", "the ", "wire."), gaps={3: 0.5}))
        db = f"sqlite:///{tmp_path / 'chat.db'}"
        env = {"OPENAI_API_KEY": "sk-test-key-123456", "OPENAI_BASE_URL": server.base_url}
        command = [PARLEY, "--db", db, "chat", "--root", str(tmp_path), "--model", "openai:gpt-t"]
        term = Terminal(f"parley-test-{uuid.uuid4().hex[:8]}", command, tmp_path, env)
        terminals.append(term)
        term.wait_for(r"(?m)^you>")
        term.type("hi")
        screen = term.wait_for(r"agent> Hello from")
        assert "wire." not in screen  # the server is still pausing: tokens arrive live
        term.wait_for(r"Hello from the wire\.")
        term.wait_for(r"■ finished")
        term.type("/quit")
        term.wait_for(r"\[exited\]")
        [request] = server.received
        assert request.json()["model"] == "gpt-t"
        assert request.json()["messages"][-1] == {"role": "user", "content": "hi"}
        assert "sk-test-key" not in term.screen()
