"""One stream for a turn's tree (docs/sub-agents.md): the turn's events and every
descendant's, each tagged with its ``path`` and an opaque ``cursor`` to resume after it.

Each turn of the tree is followed as a single turn is (:func:`parley.streaming.follow`,
its own ``seq`` order, gap-free), on a thread of its own, into one queue: the merged
stream keeps each turn's order and interleaves the turns as their events come.  A child
joins the tree when its parent's ``agent_started`` event is read, and the stream ends
once every turn it follows has ended (a parent ends after its children).

The cursor is, per turn of the tree known so far, the last seq given and where the turn
hangs (its parent turn, agent and call): resumed from it, every turn is followed from
its own seq, and every event comes exactly once, after a reconnect, a crash, or the end.
"""

from __future__ import annotations

import base64
import binascii
import json
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from parley.errors import InvalidRequest
from parley.ports.backend import Coordinator
from parley.schemas.events import Event, EventKind
from parley.store.sql_store import SqlStore
from parley.streaming import follow

MAX_CURSOR_BYTES = 1 << 20
"""The most a cursor may unpack to (a tree of thousands of turns): more is no cursor."""

POLL_SECONDS = 0.5
"""How often the merged stream looks at ``stop`` while no turn has an event."""

Path = tuple[dict[str, str], ...]


@dataclass(frozen=True, kw_only=True)
class TreeEvent(Event):
    """An event of a turn's tree: ``path`` is each agent call (``agent``, ``call_id``,
    ``turn_id``) from the followed turn down to the turn that emitted it (empty for the
    followed turn's own), ``cursor`` resumes the stream after it."""

    path: Path = ()
    cursor: str = ""


@dataclass
class TreePosition:
    """The turns of the tree known so far: the last seq given of each, and its path; what
    a cursor packs (:meth:`cursor`) and unpacks (:meth:`of`)."""

    seen: dict[str, int]
    paths: dict[str, Path]

    def joined(self, turn: str, event: Event) -> str | None:
        """The child turn an ``agent_started`` event of ``turn`` names (known from now
        on), or None for any other event."""
        if event.kind is not EventKind.AGENT_STARTED:
            return None
        child = str(event.data["turn_id"])
        if child not in self.seen:
            step = {"agent": event.data["agent"], "call_id": event.data["call_id"]}
            self.paths[child] = (*self.paths[turn], {**step, "turn_id": child})
            self.seen[child] = 0
        return child

    def cursor(self) -> str:
        entries = [[turn_id, seq, list(self.paths[turn_id])] for turn_id, seq in self.seen.items()]
        raw = json.dumps(entries, separators=(",", ":")).encode()
        # Compressed: each child's turn id comes twice, and an HTTP reader sends the
        # cursor back in a header, where every byte counts against the server's limit.
        return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")

    def advance(self, event: Event) -> str | None:
        """``event`` given: its turn's seq moves on, and the child an ``agent_started``
        names is returned (None for any other event): one not known yet joins the tree,
        followed from its start; a known one was resumed with its parent, followed from
        its last seq given if it is not followed still."""
        self.seen[event.turn_id] = event.seq
        if event.kind is not EventKind.AGENT_STARTED:
            return None
        child = str(event.data["turn_id"])
        if child not in self.seen:
            step = {"agent": event.data["agent"], "call_id": event.data["call_id"]}
            self.paths[child] = (*self.paths[event.turn_id], {**step, "turn_id": child})
            self.seen[child] = 0
        return child

    def tagged(self, event: Event) -> TreeEvent:
        """``event`` (given, :meth:`advance`) with its path and the cursor after it."""
        return _tagged(event, self.paths[event.turn_id], self.cursor())

    @classmethod
    def of(cls, turn_id: str, cursor: str | None) -> TreePosition:
        """The tree of ``turn_id`` from the start, or where ``cursor`` left it;
        :class:`InvalidRequest` for a cursor that is not one of this turn's trees."""
        if not cursor:
            return cls(seen={turn_id: 0}, paths={turn_id: ()})
        try:
            packed = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            unpacker = zlib.decompressobj()
            raw = unpacker.decompress(packed, MAX_CURSOR_BYTES)
            if unpacker.unconsumed_tail or not unpacker.eof:
                raise ValueError("not a whole cursor")
            entries = json.loads(raw)
            seen = {str(t): int(s) for t, s, _p in entries}
            paths = {str(t): tuple(dict(step) for step in p) for t, _s, p in entries}
        except (binascii.Error, zlib.error, ValueError, TypeError) as exc:
            raise InvalidRequest(f"not a cursor of a turn's tree: {cursor[:40]!r}") from exc
        if seen.get(turn_id) is None or paths.get(turn_id) != () or min(seen.values()) < 0:
            raise InvalidRequest(f"the cursor is not one of turn {turn_id!r}'s tree")
        return cls(seen=seen, paths=paths)


def check_cursor(turn_id: str, cursor: str | None) -> None:
    """:class:`InvalidRequest` unless ``cursor`` (None: the start) is one of ``turn_id``'s
    tree: what a caller checks before it promises a stream."""
    TreePosition.of(turn_id, cursor)


def follow_tree(
    turn_id: str,
    cursor: str | None,
    *,
    coordinator: Coordinator,
    store: SqlStore,
    driver_failure: Callable[[str], BaseException | None] = lambda _turn_id: None,
    stop: threading.Event | None = None,
) -> Iterator[TreeEvent]:
    """Every event of ``turn_id``'s tree after ``cursor`` (None: from the start), once
    each, each turn's in order, until every turn of the tree has ended."""
    tree = TreePosition.of(turn_id, cursor)
    inbox: queue.Queue[tuple[str, Event | BaseException | None]] = queue.Queue()
    done = threading.Event()
    following: set[str] = set()

    def start(turn: str) -> None:
        following.add(turn)
        reader = follow(
            turn,
            tree.seen[turn],
            coordinator=coordinator,
            store=store,
            driver_failure=lambda: driver_failure(turn),
            stop=done,
        )
        threading.Thread(target=_follow_one, args=(turn, reader, inbox), daemon=True).start()

    for known in list(tree.seen):
        start(known)
    try:
        while following:
            if stop is not None and stop.is_set():
                return
            try:
                turn, item = inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
            if item is None:
                following.discard(turn)
                continue
            if isinstance(item, BaseException):
                raise item
            child = tree.advance(item)
            if child is not None and child not in following:
                # New, or resumed with its parent after it ended: followed from its last
                # seq given.
                start(child)
            yield tree.tagged(item)
    finally:
        done.set()


def _follow_one(
    turn_id: str,
    reader: Iterator[Event],
    inbox: queue.Queue[tuple[str, Event | BaseException | None]],
) -> None:
    """One turn of the tree, into the merged stream's inbox (None once it ended)."""
    try:
        for event in reader:
            inbox.put((turn_id, event))
    except Exception as exc:  # the merged stream raises it to its reader
        inbox.put((turn_id, exc))
        return
    inbox.put((turn_id, None))


def _tagged(event: Event, path: Path, cursor: str) -> TreeEvent:
    values: dict[str, Any] = {
        "turn_id": event.turn_id,
        "seq": event.seq,
        "kind": event.kind,
        "data": event.data,
    }
    return TreeEvent(**values, path=path, cursor=cursor)
