"""Stopping a process a test started in a process group of its own, and starting one a
person could Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess


def stop_group(process: subprocess.Popen[bytes], grace: float = 15) -> None:
    """SIGTERM to the process's group, then SIGKILL if it has not exited after ``grace``
    seconds; nothing if it exited already."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


def as_from_a_terminal() -> None:
    """``preexec_fn`` of a command a test Ctrl-Cs: SIGINT at its default, as a terminal's
    shell starts it.  A test run started in the background (``cmd &`` from a script)
    ignores SIGINT, and every process it starts inherits that: Python then installs no
    KeyboardInterrupt, and the command would never hear the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
