"""What a command writes, and where: its consoles, a notice on stderr, and the end of a
pipe that closed under it.

On a terminal a console is rich's own (colours, lines wrapped at the terminal's width).
Anywhere else (a pipe, a file) it writes plain lines as long as they are: rich would wrap
them at 80 columns and split the ids a script copies out of them.  A reader that goes
away (``parley batch results ID | head``) ends the command quietly, with the status a
Unix tool killed by SIGPIPE has, not a ``BrokenPipeError`` traceback."""

from __future__ import annotations

import logging
import os
import signal
import sys

from rich.console import Console
from rich.text import Text

from parley.logs import LogFormat

log = logging.getLogger("parley.cli")

_log_format = LogFormat.TEXT
"""The command's ``PARLEY_LOG_FORMAT`` (:func:`use_log_format`, as it starts)."""


def use_log_format(chosen: LogFormat) -> None:
    """The format the command logs in, read as it started: its notices follow it."""
    global _log_format
    _log_format = chosen


UNWRAPPED_WIDTH = 1_000_000
"""A console's width off a terminal: no line of a command is that long, so none wraps
(rich crops a tree's lines at the width, even when told not to wrap)."""

CLOSED_PIPE_STATUS = 128 + signal.SIGPIPE
"""The exit status of a command whose reader went away (141, as for ``yes | head``)."""


class CommandConsole(Console):
    """A command's console: a closed pipe is the command's to end (:func:`main
    <parley.cli.main>` does, as for any other write), not rich's (which exits 1)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError("the reader of the command's output went away")


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): rich's own on a terminal; elsewhere plain lines
    that never wrap.  Text is never read as markup by the commands (they print
    :class:`~rich.text.Text`), and never highlighted."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return CommandConsole(stderr=stderr, highlight=False)
    return CommandConsole(stderr=stderr, highlight=False, soft_wrap=True, width=UNWRAPPED_WIDTH)


def notice(line: str, style: str | None = None) -> None:
    """One line for the person running the command, on stderr (stdout is the command's
    output, which a script reads).  A process that logs JSON (``PARLEY_LOG_FORMAT``)
    logs it instead, a warning of ``parley.cli``: its stderr stays JSON lines."""
    if _log_format is LogFormat.JSON:
        log.warning("%s", line)
        return
    console(stderr=True).print(Text(line, style or ""), soft_wrap=True)


def leave_closed_pipe() -> int:
    """After a ``BrokenPipeError``: point stdout at ``/dev/null`` (Python flushes it at
    exit, which would fail again and say so) and return the exit status to end with."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return CLOSED_PIPE_STATUS
