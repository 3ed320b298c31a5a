"""A real terminal for the command line's tests: a tmux pane running a command, on a
private tmux server, whose screen a test reads and types into."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


class Terminal:
    """One tmux pane running a command, on a private tmux server."""

    def __init__(
        self, socket: str, command: list[str], cwd: Path, env: dict[str, str] | None = None
    ) -> None:
        self.socket = socket
        self.name = f"chat-{uuid.uuid4().hex[:8]}"
        settings = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
        self._tmux(
            "new-session", "-d", "-s", self.name, "-x", "160", "-y", "50", "-c", str(cwd),
            # Keep the pane after the program exits so its last words can be read.
            " ".join(["env", *settings, *command]) + "; echo '[exited]'; sleep 60",
        )  # fmt: skip

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def type(self, text: str) -> None:
        self.keys(text)
        self._tmux("send-keys", "-t", self.name, "Enter")

    def keys(self, text: str) -> None:
        """Type ``text`` without pressing Enter."""
        self._tmux("send-keys", "-t", self.name, "-l", text)

    def ctrl_c(self) -> None:
        self._tmux("send-keys", "-t", self.name, "C-c")

    def screen(self) -> str:
        # The whole scrollback, joined where tmux wrapped long lines.
        return self._tmux("capture-pane", "-p", "-J", "-S", "-2000", "-t", self.name)

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 20) -> str:
        """Wait until ``pattern`` (a regex) appears ``count`` times on the screen."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if len(re.findall(pattern, screen)) >= count:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} ×{count} never appeared; screen:\n{screen}")
            time.sleep(0.05)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-session", "-t", self.name], check=False)


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.kill()
    if opened:
        subprocess.run(["tmux", "-L", opened[0].socket, "kill-server"], check=False)
