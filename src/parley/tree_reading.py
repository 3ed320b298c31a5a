"""A turn's tree read from a seq of the turn's own (docs/sub-agents.md#one-stream-for-the-tree):
what the command line shows (``parley follow --after``, ``submit``, ``resume``, ``chat``).

A tree stream resumes from a cursor, but a person names a point of the turn by its seq
(``follow --after`` prints them): the tree is read from its start, and the followed turn's
events up to that seq are left out, and with them the children its calls opened before
it (a child whose ``agent_started`` came at or before the seq was shown already, or is
history).  The last cursor read is kept, so a reader that stops (Ctrl-C) goes on from it.
"""

from __future__ import annotations

from collections.abc import Iterator

from parley.schemas.events import EventKind
from parley.tree_stream import TreeEvent
from parley.turn_handle import TurnHandle


class TreeReader:
    """``handle``'s tree after its own seq ``after`` (0: all of it)."""

    def __init__(self, handle: TurnHandle, after: int = 0) -> None:
        self.handle = handle
        self.after = after
        self.cursor: str | None = None
        """The cursor of the last event read (shown or left out)."""
        self._shown: set[str] = set()  # the children whose agent_started was shown

    def __iter__(self) -> Iterator[TreeEvent]:
        """The tree's events from where the last read stopped."""
        for event in self.handle.events(self.cursor or 0, children=True):
            self.cursor = event.cursor
            if self._shows(event):
                yield event

    def _shows(self, event: TreeEvent) -> bool:
        if event.path:
            return self.after == 0 or event.path[0]["turn_id"] in self._shown
        if event.seq <= self.after:
            return False
        if event.kind is EventKind.AGENT_STARTED:
            self._shown.add(str(event.data["turn_id"]))
        return True
