"""One thread that wakes sessions at the times asked (an embedded client's delayed turns:
docs/time.md#how-it-starts-on-time), soonest first.

A thread per delayed turn would be a hundred thousand threads for a hundred thousand
turns; a heap and one thread cost a tuple each.  What the timer holds dies with the
process: the store's release of due runs is the backstop."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("parley.client")


class WakeTimer:
    """Calls ``fire(session_id, priority)`` once each asked time comes (see the module
    docstring); started at the first time asked, stopped by :meth:`close`."""

    def __init__(self, fire: Callable[[str, str], None]) -> None:
        self._fire = fire
        self._due: list[tuple[float, int, str, str]] = []
        self._order = itertools.count()  # (equal times keep the order they were asked in)
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def at(self, seconds: float, session_id: str, priority: str) -> None:
        """Fire for ``session_id`` in ``seconds`` (on the monotonic clock)."""
        with self._changed:
            if self._closed:
                return
            entry = (time.monotonic() + seconds, next(self._order), session_id, priority)
            heapq.heappush(self._due, entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="parley-wake-timer", daemon=True
                )
                self._thread.start()
            self._changed.notify()

    def pending(self) -> int:
        """How many times are still to come."""
        with self._changed:
            return len(self._due)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._closed:
                    if not self._due:
                        self._changed.wait()
                        continue
                    left = self._due[0][0] - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
                if self._closed:
                    return
                _at, _n, session_id, priority = heapq.heappop(self._due)
            try:
                self._fire(session_id, priority)
            except Exception:  # (one failed wake must not stop the others)
                log.warning("could not wake session %s", session_id, exc_info=True)

    def close(self, timeout: float | None = None) -> None:
        """Forget the times still to come and stop the thread."""
        with self._changed:
            self._closed = True
            self._due.clear()
            self._changed.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
