"""Waiting in a test for something another thread or process does: one poll loop."""

from __future__ import annotations

import time
from typing import Any

POLL_SECONDS = 0.02


def wait_until(condition: Any, timeout: float = 30, what: str = "condition") -> Any:
    """Poll ``condition`` (a callable of no arguments; ``Any``, as a lambda with default
    arguments binding a loop's values is one too) until it returns something true, and
    return that; fail the test, naming ``what`` it waited for, after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"timed out waiting for {what}")
