"""The SSE fan-out: one reader per live turn per gateway process, shared by every
subscriber of that turn.

A :class:`TurnFeed` follows its turn once, on one thread, with the same reader as
``TurnHandle.events`` (replay buffer, then the store, then live: docs/guarantees.md#8-streaming),
and keeps the turn's events in one list.  Subscribers are asynchronous: each holds an index into
that list and waits on the feed's signal, so a thousand browsers on one turn cost one Redis
reader, one list and a thousand small cursors.  Each event is encoded for the wire once
per feed, and what a subscriber is behind by goes out in one chunk.  A slow subscriber
only falls behind in the list (its socket's send blocks it alone); one more than
:data:`MAX_LAG` events behind is dropped, and reconnects with ``Last-Event-ID``.

A feed nobody follows any more stops after :data:`LINGER_SECONDS` (a reconnecting reader
finds it still there); one whose turn has ended is reused only while the store agrees the
turn has not moved on (a resumed turn gets a fresh feed).

A submission that says it will be streamed starts its turn's feed itself
(:meth:`Feeds.follow_submitted`), so the feed reads Redis while the answer goes out and
the stream's request finds it already following: the stream's first token waits for no
read of its own.  Such a feed knows its turn and tenant from the submission, which
answers the stream's tenant check (:meth:`Feeds.owned`) without reading the turn again.
It holds every event from seq 1, so a stream that comes later misses nothing; one that
never comes costs a feed for :data:`UNCLAIMED_SECONDS`, and no more than
:data:`MAX_UNCLAIMED` such feeds wait at once (past that a submission starts none, and
its stream starts its feed as any other).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing

from parley.client import Client
from parley.schemas.events import Event
from parley.schemas.records import TurnRecord
from parley.telemetry import metrics
from parley.turn_handle import TurnHandle

log = logging.getLogger("parley.gateway.feeds")

MAX_LAG = 10_000
CHUNK_EVENTS = 256
LINGER_SECONDS = 10.0
UNCLAIMED_SECONDS = 10.0
"""How long a feed a submission started waits for its first subscriber."""
MAX_UNCLAIMED = 256
"""How many feeds submissions started may wait for their first subscriber at once."""


class FellBehind(Exception):
    """A subscriber was too far behind its feed and is dropped (it may reconnect)."""


class TurnFeed:
    """One turn's events, read once for every subscriber of this process."""

    def __init__(
        self,
        client: Client,
        turn_id: str,
        loop: asyncio.AbstractEventLoop,
        record: TurnRecord | None = None,
        owner: str | None = None,
    ) -> None:
        self.turn_id = turn_id
        self._record = record
        self.owner = owner
        """The tenant owning the turn, when whoever made the feed had checked it."""
        self.events: list[Event] = []
        self._frames: list[bytes] = []  # events[i] encoded, for as many as were asked
        self.done = False
        self.failure: BaseException | None = None
        self.subscribers = 0
        self._client = client
        self._loop = loop
        self._signal = asyncio.Event()
        self._stop = threading.Event()
        # Events the follower thread has read and the loop has not taken yet: the thread
        # wakes the loop once per batch, not once per token.
        self._inbox: list[Event] = []
        self._inbox_lock = threading.Lock()
        self._wake_scheduled = False
        self._linger: asyncio.TimerHandle | None = None
        self._thread = threading.Thread(
            target=self._follow, name=f"parley-feed-{turn_id[:8]}", daemon=True
        )

    def start(self) -> None:
        """Start following the turn."""
        self._thread.start()

    def stop(self) -> None:
        """Stop following (the thread ends within a poll)."""
        self._stop.set()

    @property
    def record(self) -> TurnRecord | None:
        """The turn as whoever made the feed read it (None if it did not)."""
        return self._record

    @property
    def last_seq(self) -> int:
        """The newest seq the feed holds (0 if none)."""
        return self.events[-1].seq if self.events else 0

    @property
    def signal(self) -> asyncio.Event:
        """Set when the feed next changes (take it before looking at the feed)."""
        return self._signal

    def encoded(self, start: int, stop: int, encode: Callable[[Event], bytes]) -> bytes:
        """``events[start:stop]`` as ``encode`` makes them, joined; each event is encoded
        once, for every subscriber (the encoder must be the same for all)."""
        frames = self._frames
        while len(frames) < stop:
            frames.append(encode(self.events[len(frames)]))
        return frames[start] if stop - start == 1 else b"".join(frames[start:stop])

    def index_after(self, seq: int) -> int:
        """The position of the first event with a seq above ``seq``."""
        return bisect.bisect_right(self.events, seq, key=lambda event: event.seq)

    # ------------------------------------------------------------------ the thread

    def _follow(self) -> None:
        failure: BaseException | None = None
        try:
            # A subscriber that read the turn already hands it over: one read less
            # before the feed reads Redis (on the way to a new turn's first token).
            record = self._record
            if record is None:
                handle = self._client.attach(self.turn_id)
            else:
                handle = TurnHandle(self._client.runtime, record)
            for event in handle.events(after=0, stop=self._stop):
                with self._inbox_lock:
                    self._inbox.append(event)
                    if self._wake_scheduled:
                        continue
                    self._wake_scheduled = True
                self._call(self._take)
        except Exception as exc:  # the reader failed: its subscribers are told
            failure = exc
        self._call(self._finish, failure)

    def _call(self, callback: object, *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)  # type: ignore[arg-type]
        except RuntimeError:  # the loop has closed: the gateway is stopping
            self._stop.set()

    # ------------------------------------------------------------------ the loop

    def _take(self) -> None:
        with self._inbox_lock:
            batch, self._inbox = self._inbox, []
            self._wake_scheduled = False
        self.events.extend(batch)
        self._changed()

    def _finish(self, failure: BaseException | None) -> None:
        self._take()
        self.done = True
        self.failure = failure
        if failure is not None and not self._stop.is_set():
            log.warning("the reader of turn %s failed: %s", self.turn_id, failure)
        self._changed()

    def _changed(self) -> None:
        self._signal.set()
        self._signal = asyncio.Event()

    def linger(self, then: object, seconds: float | None = None) -> None:
        """Call ``then`` after ``seconds`` (:data:`LINGER_SECONDS` by default) unless a
        subscriber comes (back) first."""
        self.cancel_linger()
        delay = LINGER_SECONDS if seconds is None else seconds
        self._linger = self._loop.call_later(delay, then)  # type: ignore[arg-type]

    def cancel_linger(self) -> None:
        """A subscriber came back."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None


class Feeds:
    """Every feed of this process, by turn."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._feeds: dict[str, TurnFeed] = {}
        # The feeds submissions started whose first subscriber has not come yet.
        self._unclaimed: set[TurnFeed] = set()

    @property
    def live(self) -> int:
        """Turns followed now (for metrics and tests: one reader each)."""
        return sum(1 for feed in self._feeds.values() if not feed.done)

    @property
    def subscribers(self) -> int:
        """Subscribers across every feed."""
        return sum(feed.subscribers for feed in self._feeds.values())

    @property
    def unclaimed(self) -> int:
        """Feeds submissions started that no subscriber has come to yet."""
        return len(self._unclaimed)

    def follow_submitted(self, record: TurnRecord, owner: str) -> bool:
        """Start following a turn just submitted by ``owner``, whose stream is to come
        (on the loop); False if the turn has a feed already, or :data:`MAX_UNCLAIMED`
        started feeds wait for their stream (the stream then starts one as before)."""
        if record.turn_id in self._feeds or len(self._unclaimed) >= MAX_UNCLAIMED:
            return False
        feed = TurnFeed(
            self._client, record.turn_id, asyncio.get_running_loop(), record, owner=owner
        )
        self._feeds[record.turn_id] = feed
        self._unclaimed.add(feed)
        feed.start()
        feed.linger(lambda: self._retire(feed), UNCLAIMED_SECONDS)
        return True

    def owned(self, turn_id: str, owner: str) -> TurnRecord | None:
        """The turn, if a feed of it knows it for ``owner``'s (None otherwise: the caller
        asks the store, which answers another tenant's turn as unknown)."""
        feed = self._feeds.get(turn_id)
        if feed is None or feed.owner != owner:
            return None
        return feed.record

    async def subscribe(
        self, turn_id: str, after: int, *, record: TurnRecord | None = None
    ) -> AsyncIterator[Event]:
        """The turn's events with seq > ``after``, once each and in order, ending after the
        turn's ``end``; :class:`FellBehind` if this subscriber falls too far behind, and the
        reader's own error if it failed.  ``record``: the turn, if the caller has read it
        (a feed made for this subscriber then need not read it again)."""
        async with aclosing(self._spans(turn_id, after, record)) as spans:
            async for feed, start, stop in spans:
                for event in feed.events[start:stop]:
                    yield event

    async def frames(
        self,
        turn_id: str,
        after: int,
        encode: Callable[[Event], bytes],
        *,
        record: TurnRecord | None = None,
    ) -> AsyncIterator[bytes]:
        """The same events as :meth:`subscribe`, as ``encode`` makes them bytes: each
        event is encoded once per feed, for every subscriber of the turn, and the events a
        subscriber is behind by go out joined, in one chunk of up to :data:`CHUNK_EVENTS`
        (so the further behind it is, the less each event costs it)."""
        async with aclosing(self._spans(turn_id, after, record)) as spans:
            async for feed, start, stop in spans:
                for first in range(start, stop, CHUNK_EVENTS):
                    yield feed.encoded(first, min(stop, first + CHUNK_EVENTS), encode)

    async def _spans(
        self, turn_id: str, after: int, record: TurnRecord | None
    ) -> AsyncGenerator[tuple[TurnFeed, int, int], None]:
        """Spans ``feed.events[start:stop]`` of the turn's events with seq > ``after``,
        in order, each new to this subscriber, until the turn's end."""
        feed = await self._acquire(turn_id, record)
        try:
            index = 0
            # A subscriber may start far behind (a long turn read from its start): the
            # lag only counts once it has caught up, as a measure of falling behind.
            caught_up = False
            while True:
                signal = feed.signal
                if index < len(feed.events) and feed.events[index].seq <= after:
                    # The feed began with this subscriber (a reconnect to another process,
                    # or after the feed retired) and reads the turn from its start: what
                    # it has read so far may still end before ``after``.
                    index = feed.index_after(after)
                stop = len(feed.events)
                if stop > index:
                    if caught_up and stop - index > MAX_LAG:
                        raise FellBehind(f"more than {MAX_LAG} events behind on {turn_id}")
                    yield feed, index, stop
                    index = stop
                    continue  # the feed may have grown while the span was sent
                if feed.done:
                    if feed.failure is not None:
                        raise feed.failure
                    return
                caught_up = True
                await signal.wait()
        finally:
            self._release(feed)

    async def _acquire(self, turn_id: str, record: TurnRecord | None) -> TurnFeed:
        feed = self._feeds.get(turn_id)
        if feed is not None and feed.done and not await self._still_current(feed):
            feed = None
        if feed is None:
            feed = TurnFeed(self._client, turn_id, asyncio.get_running_loop(), record)
            self._feeds[turn_id] = feed
            feed.start()
        feed.cancel_linger()
        self._unclaimed.discard(feed)
        feed.subscribers += 1
        metrics.sse_connected()
        return feed

    async def _still_current(self, feed: TurnFeed) -> bool:
        """Whether a feed whose reader has finished still holds the whole turn: it did not
        fail and the store has nothing newer (a resume adds events)."""
        if feed.failure is not None:
            return False
        stored = await asyncio.to_thread(self._client.stored_seq, feed.turn_id)
        return stored <= feed.last_seq

    def _release(self, feed: TurnFeed) -> None:
        feed.subscribers -= 1
        metrics.sse_disconnected()
        if feed.subscribers == 0:
            feed.linger(lambda: self._retire(feed))

    def _retire(self, feed: TurnFeed) -> None:
        if feed.subscribers:
            return
        self._unclaimed.discard(feed)
        feed.stop()
        if self._feeds.get(feed.turn_id) is feed:
            del self._feeds[feed.turn_id]

    def close(self) -> None:
        """Stop every reader."""
        for feed in self._feeds.values():
            feed.cancel_linger()
            feed.stop()
        self._feeds.clear()
        self._unclaimed.clear()
