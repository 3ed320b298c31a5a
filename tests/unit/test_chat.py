"""``parley chat``'s loop, driven without a terminal (the tmux tests drive the real one)."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

import parley
from parley.chat import Chat
from parley.errors import TurnEnded

ECHO = {"rules": [{"when": ".*", "steps": [{"text": "heard: {last_message}"}]}]}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[parley.Client]:
    host = parley.Host(model=parley.models.ScriptedModel(ECHO))
    with parley.connect(f"sqlite:///{tmp_path / 'db.sqlite'}", host=host) as opened:
        yield opened


def lines(*typed: str) -> object:
    queue = list(typed)

    def read_line() -> str:
        if not queue:
            raise EOFError
        line = queue.pop(0)
        if line == "^C":
            raise KeyboardInterrupt
        return line

    return read_line


class EndedHandle:
    """A turn that ended just as the operator typed a steer for it."""

    def say(self, text: str) -> None:
        raise TurnEnded("the turn has ended")

    def approvals(self) -> list[parley.Approval]:
        return []  # none of its calls waited for an answer


def test_a_line_typed_as_the_turn_ends_starts_the_next_turn(
    client: parley.Client, tmp_path: Path
) -> None:
    session = client.open_session(str(tmp_path))
    output = io.StringIO()
    chat = Chat(client, session, Console(file=output), read_line=lines())  # type: ignore[arg-type]
    chat._handle = EndedHandle()  # type: ignore[assignment]
    assert chat._on_line("and another thing")
    chat._wait_for_turn()
    assert [t.prompt for t in session.history()] == ["and another thing"]
    assert "heard: and another thing" in output.getvalue()


def test_ctrl_c_while_a_line_is_handled_quits_when_nothing_runs(
    client: parley.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = client.open_session(str(tmp_path))

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "submit", interrupted)
    output = io.StringIO()
    chat = Chat(client, session, Console(file=output), read_line=lines("hello"))  # type: ignore[arg-type]
    started = time.monotonic()
    assert chat.run() == 0
    assert time.monotonic() - started < 5
    assert "bye" in output.getvalue()
