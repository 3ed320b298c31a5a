"""A per-process cache of each settled turn's replayed messages.

Every request replays the whole history path, so without a cache the claim of turn 1000
loads and decodes the steps of the 999 turns before it, every time.  A turn whose
outcome can no longer change (finished, succeeded, check_failed, budget_exceeded: not
cancelled or failed, which ``resume`` may continue) replays to the same messages
forever, so its messages are kept here, keyed by turn id, and the store is asked only
for the steps of turns this process has not seen.  The cache is an optimisation only:
a miss (another process ran the turn, or it was evicted) loads the steps as before.

It is bounded by the size of what it holds, not by a number of turns: a turn of a
chat is a few hundred bytes, one whose tools read files can be a hundred kilobytes.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence

from parley.schemas.messages import AssistantMessage, Message, ToolMessage, UserMessage
from parley.schemas.records import TurnStatus

DEFAULT_CAPACITY_BYTES = 64 * 1024 * 1024
"""What the cache may hold per process, counted as :func:`replay_size` counts."""

ENTRY_BYTES = 200
"""What a cached turn costs besides its messages' texts (its id, the entry, the tuple)."""

MESSAGE_BYTES = 100
"""What a message costs besides its texts (the object and its other fields)."""


def replay_size(messages: Sequence[Message]) -> int:
    """About how many bytes a turn's replayed messages take in memory (texts counted
    exactly: a character of CJK text takes two or four bytes, not one)."""
    size = ENTRY_BYTES
    for message in messages:
        size += MESSAGE_BYTES
        if isinstance(message, UserMessage):
            size += sys.getsizeof(message.text)
        elif isinstance(message, AssistantMessage):
            size += sys.getsizeof(message.text) + sum(
                MESSAGE_BYTES + sum(map(sys.getsizeof, (c.id, c.name, c.arguments)))
                for c in message.tool_calls
            )
        elif isinstance(message, ToolMessage):
            size += sum(map(sys.getsizeof, (message.call_id, message.name, message.content)))
    return size


class ReplayCache:
    """Thread-safe LRU of turn id → that turn's checked replay messages, holding at most
    ``capacity_bytes`` of them."""

    def __init__(self, capacity_bytes: int = DEFAULT_CAPACITY_BYTES) -> None:
        self._capacity = capacity_bytes
        self._entries: OrderedDict[str, tuple[tuple[Message, ...], int]] = OrderedDict()
        self._bytes = 0
        self._guard = threading.Lock()

    def get(self, turn_id: str) -> tuple[Message, ...] | None:
        """The turn's messages, if cached."""
        with self._guard:
            entry = self._entries.get(turn_id)
            if entry is None:
                return None
            self._entries.move_to_end(turn_id)
            return entry[0]

    def knows(self, turn_id: str) -> bool:
        """Whether the turn is cached (what the store asks before loading its steps)."""
        with self._guard:
            return turn_id in self._entries

    def put(self, turn_id: str, status: TurnStatus, messages: tuple[Message, ...]) -> None:
        """Keep a turn's messages if its outcome is settled (and they fit at all)."""
        if not status.settled:
            return
        size = replay_size(messages)
        if size > self._capacity:
            return
        with self._guard:
            previous = self._entries.pop(turn_id, None)
            if previous is not None:
                self._bytes -= previous[1]
            self._entries[turn_id] = (messages, size)
            self._bytes += size
            while self._bytes > self._capacity:
                _evicted, (_messages, evicted_size) = self._entries.popitem(last=False)
                self._bytes -= evicted_size

    def __len__(self) -> int:
        with self._guard:
            return len(self._entries)

    @property
    def size(self) -> int:
        """The bytes held, as :func:`replay_size` counts them."""
        with self._guard:
            return self._bytes
