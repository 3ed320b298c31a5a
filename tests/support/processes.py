"""Stopping a process a test started in a process group of its own."""

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
