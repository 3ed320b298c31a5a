"""A turn's tree from the process's shared feeds (docs/sub-agents.md#one-stream-for-the-tree):
the turn's events and every descendant's, each a :class:`~parley.tree_stream.TreeEvent`
with its ``path`` and the ``cursor`` that resumes after it, each turn's once and in its
order, the turns interleaved as their events come.  A child joins when its parent's
``agent_started`` is read, and the tree's feed is over once every turn of it has ended.

The same stream as :func:`parley.tree_stream.follow_tree` (the same cursors), read in the
gateway: each turn from :meth:`Feeds.subscribe` (the feed every view of that turn
shares), by a task of its own into one queue, so a page or a protocol view following a
tree costs no thread and reads no turn twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from parley.gateway.feeds import Feeds
from parley.schemas.events import Event
from parley.tree_stream import TreeEvent, TreePosition

_Item = Event | str | BaseException
"""A turn's event, its id once its feed is over, or what its feed raised."""


async def tree_feed(
    feeds: Feeds, turn_id: str, cursor: str | None = None
) -> AsyncGenerator[TreeEvent]:
    """Every event of ``turn_id``'s tree after ``cursor`` (None: from the start; one that
    is not this tree's is :class:`~parley.errors.InvalidRequest`, before anything is
    read); what a turn's feed raises (:class:`~parley.gateway.feeds.FellBehind`, a failed
    reader) is raised here."""
    tree = TreePosition.of(turn_id, cursor)
    inbox: asyncio.Queue[_Item] = asyncio.Queue()
    readers: list[asyncio.Task[None]] = []

    following: set[str] = set()

    def follow(turn: str) -> None:
        following.add(turn)
        reader = _read(feeds, turn, tree.seen[turn], inbox)
        readers.append(asyncio.create_task(reader, name=f"tree-feed-{turn}"))

    for known in list(tree.seen):
        follow(known)
    try:
        while following:
            item = await inbox.get()
            if isinstance(item, str):
                following.discard(item)
                continue
            if isinstance(item, BaseException):
                raise item
            child = tree.advance(item)
            if child is not None and child not in following:
                # New, or resumed with its parent after it ended: followed from its last
                # seq given.
                follow(child)
            yield tree.tagged(item)
    finally:
        for reader in readers:
            reader.cancel()


async def _read(feeds: Feeds, turn_id: str, start: int, inbox: asyncio.Queue[_Item]) -> None:
    """One turn of the tree into the inbox: its events, then its id (or what failed)."""
    try:
        async for event in feeds.subscribe(turn_id, start):
            await inbox.put(event)
    except Exception as exc:  # the tree's reader raises it
        await inbox.put(exc)
        return
    await inbox.put(turn_id)
