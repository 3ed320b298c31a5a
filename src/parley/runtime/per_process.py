"""One of something per process: built on first use, once, however many threads ask at
the same moment, and built again in a process forked from one that had it.

A fleet process's runtime (its engine, store, coordinator and their pools) is such a
thing.  On prefork Celery builds it in each child (``worker_process_init``), but the
threads pool sends no such signal: the first kicks of a burst all ask for it at once, on
threads of their own, and without a lock each finds none and builds one, with pools of
its own, which its coordinator's threads then keep alive, connections and all, beside
the one the process goes on using.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """The value ``build`` returns, built at most once in each process."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._value: T | None = None
        self._pid = 0
        self._lock = threading.Lock()
        # A fork copies the lock as it was: held, if another thread was building then,
        # by a thread the child does not have.  The child starts with a free one.
        os.register_at_fork(after_in_child=self._forked)

    def get(self) -> T:
        """This process's value, built now if it has none yet (other threads asking
        meanwhile wait for it, and get the same one)."""
        value, pid = self._value, self._pid
        if value is not None and pid == os.getpid():
            return value
        with self._lock:
            if self._value is None or self._pid != os.getpid():
                self._value = self._build()
                self._pid = os.getpid()
            return self._value

    def _forked(self) -> None:
        self._lock = threading.Lock()
