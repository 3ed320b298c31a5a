"""A per-process cache of each settled turn's replayed messages.

Every request replays the whole history path, so without a cache the claim of turn 1000
loads and decodes the steps of the 999 turns before it, every time.  A turn whose
outcome can no longer change (finished, succeeded, check_failed, budget_exceeded: not
cancelled or failed, which ``resume`` may continue) replays to the same messages
forever, so its messages are kept here, keyed by turn id, and the store is asked only
for the steps of turns this process has not seen.  The cache is an optimisation only:
a miss (another process ran the turn, or it was evicted) loads the steps as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from schemas.messages import Message
from schemas.records import TurnStatus

DEFAULT_CAPACITY = 20_000
"""Turns kept per process; a settled turn replays to a few messages, so this is a few
tens of megabytes at most for sessions of ordinary size."""


class ReplayCache:
    """Thread-safe LRU of turn id → that turn's checked replay messages."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, tuple[Message, ...]] = OrderedDict()
        self._guard = threading.Lock()

    def get(self, turn_id: str) -> tuple[Message, ...] | None:
        """The turn's messages, if cached."""
        with self._guard:
            messages = self._entries.get(turn_id)
            if messages is not None:
                self._entries.move_to_end(turn_id)
            return messages

    def knows(self, turn_id: str) -> bool:
        """Whether the turn is cached (what the store asks before loading its steps)."""
        with self._guard:
            return turn_id in self._entries

    def put(self, turn_id: str, status: TurnStatus, messages: tuple[Message, ...]) -> None:
        """Keep a turn's messages if its outcome is settled."""
        if not status.settled:
            return
        with self._guard:
            self._entries[turn_id] = messages
            self._entries.move_to_end(turn_id)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._guard:
            return len(self._entries)
