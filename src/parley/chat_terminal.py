"""The terminal of ``parley chat``: what the person types stays on its own input line.

A reply streams while the person may be typing a steer.  With both on one line, the
terminal's echo lands inside the streamed text (``"tmake it about a catell me a long
story"``).  Here prompt_toolkit owns the bottom of the screen: the input line, and just
above it the line being streamed, drawn whole with the prompt; every line that is
complete is printed above both (prompt_toolkit's ``StdoutProxy``), where it stays.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from types import TracebackType

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import ANSI
from prompt_toolkit.patch_stdout import StdoutProxy
from rich.console import Console

PROMPT = "\x1b[1;36myou>\x1b[0m "


class ChatTerminal:
    """A terminal for one chat: :attr:`console` prints the stream (tokens inline, from
    any thread), :attr:`notices` prints whole lines above it without breaking it, and
    :meth:`read_line` reads a line under the prompt.  A context manager: inside it,
    anything else written to stdout or stderr goes above the input line too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streaming = ""  # the line being streamed, not yet ended by a newline
        # Complete lines go above the prompt at once (the default waits 0.2 s to batch
        # them, and the streamed line would vanish from the prompt for that long).
        self._above = StdoutProxy(sleep_between_writes=0, raw=True)
        # What was typed is erased with the prompt and printed above instead: left in
        # place, the streamed line drawn with it would stay on the screen cut short.
        self._session: PromptSession[str] = PromptSession(erase_when_done=True)
        self._redirects = contextlib.ExitStack()
        # (rich types its file as IO[str]; write, flush and isatty are what it calls.)
        stream = _Stream(self)
        self.console = Console(file=stream, force_terminal=True, highlight=False)  # type: ignore[arg-type]
        self.notices = Console(file=self._above, force_terminal=True, highlight=False)  # type: ignore[arg-type]

    def __enter__(self) -> ChatTerminal:
        self._redirects.enter_context(contextlib.redirect_stdout(self._above))
        self._redirects.enter_context(contextlib.redirect_stderr(self._above))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        with self._lock:
            rest, self._streaming = self._streaming, ""
        if rest:
            self._above.write(rest + "\n")
        self._redirects.close()
        self._above.close()

    def read_line(self) -> str:
        """One line typed under the prompt, then shown above it (``EOFError`` for
        Ctrl-D on an empty line, ``KeyboardInterrupt`` for Ctrl-C, as ``input`` raises
        them)."""
        line = self._session.prompt(self._message)
        self._above.write(f"{PROMPT}{line}\n")
        self._above.flush()
        return line

    def _message(self) -> ANSI:
        with self._lock:
            streaming = self._streaming
        return ANSI(f"{streaming}\n{PROMPT}" if streaming else PROMPT)

    def _stream(self, data: str) -> None:
        """Its complete lines above the prompt, the rest drawn with it."""
        with self._lock:
            complete, newline, self._streaming = (self._streaming + data).rpartition("\n")
            if newline:
                self._above.write(complete + newline)
                self._above.flush()
        self._session.app.invalidate()  # (thread-safe; nothing while no prompt is up)


class _Stream:
    """The file the stream's console writes to."""

    def __init__(self, terminal: ChatTerminal) -> None:
        self._terminal = terminal

    def write(self, data: str) -> int:
        """Print ``data`` on the stream."""
        self._terminal._stream(data)
        return len(data)

    def flush(self) -> None:
        """Nothing to flush: every complete line went out as it was written."""

    def isatty(self) -> bool:
        """A terminal, as rich asks."""
        return sys.__stdout__ is not None and sys.__stdout__.isatty()
