"""The in-process coordinator: session locks, replay buffers and steer lists for the
embedded client (and for tests), behind the same port as the Redis one."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence

from parley.ports.backend import Coordinator
from parley.schemas.events import Event, EventKind
from parley.schemas.records import Steer

RETAINED_TURNS = 256
"""How many ended turns' replay buffers (tokens included) are kept; older turns are
replayed from the store, without their tokens.  A turn that has not ended keeps its
buffer, up to UNENDED_FACTOR times the count: while it runs, its replay window is the
whole turn."""
UNENDED_FACTOR = 4
"""Past this many times RETAINED_TURNS buffers, the least recently published go whether
their turns ended or not: turns that never end (a driver that died with nobody resuming,
an announcement whose submission rolled back) must not grow the process forever."""


class LocalLock:
    """A held in-process session lock."""

    def __init__(self, work_mark: int, release: Callable[[], int]) -> None:
        self.work_mark = work_mark
        self._release = release
        self._held = True

    def held(self) -> bool:
        """In one process a lock cannot expire: held until released."""
        return self._held

    def release(self, *, handing_over: bool = False) -> int | None:
        """Give the lock back (once); returns the work mark as it stands then (no kick
        is ever pending in process: ``handing_over`` changes nothing)."""
        if not self._held:
            return None
        self._held = False
        return self._release()


class LocalCoordinator(Coordinator):
    """Thread-safe, in-memory implementation of the coordinator port."""

    def __init__(self, retained_turns: int = RETAINED_TURNS) -> None:
        self._guard = threading.Lock()
        self._changed = threading.Condition(self._guard)
        self._held: set[str] = set()  # the sessions whose lock a driver holds
        self._buffers: OrderedDict[str, list[Event]] = OrderedDict()
        self._ends: dict[str, int] = {}  # the newest buffered ``end`` seq of each turn
        self._rung: set[str] = set()  # doorbells rung and not yet answered (wait_ends)
        # The steers accepted for turns that have a buffer here (a turn without one reads
        # its steers from the store).
        self._steers: dict[str, list[Steer]] = {}
        self._marks: dict[str, int] = {}
        self._owners: dict[str, int] = {}
        self._retained = retained_turns

    # ------------------------------------------------------------------ locks

    def try_lock(self, session_id: str) -> LocalLock | None:
        """The session's lock if nobody in this process holds it."""
        with self._guard:
            if session_id in self._held:
                return None
            self._held.add(session_id)
            mark = self._marks.get(session_id, 0)
        return LocalLock(mark, lambda: self._unlock(session_id))

    def unattended(self, session_ids: Sequence[str]) -> list[str]:
        """Of ``session_ids``, those that no driver of this process holds."""
        with self._guard:
            return [session_id for session_id in session_ids if session_id not in self._held]

    def _unlock(self, session_id: str) -> int:
        """Let the session go; returns its work mark as it stood then.  An idle session
        keeps nothing here (a long-lived process sees sessions without end): the next
        driver reads the mark afresh, and every in-process submission kicks anyway."""
        with self._guard:
            self._held.discard(session_id)
            return self._marks.pop(session_id, 0)

    def mark_work(self, session_id: str, events: Sequence[Event] = ()) -> bool:
        """Publish ``events`` and bump the session's work mark; in-process kicks are
        always worth sending."""
        self.publish(events)
        with self._guard:
            if session_id in self._held:  # only a driver that holds the session reads it
                self._marks[session_id] = self._marks.get(session_id, 0) + 1
        return True

    # ------------------------------------------------------------------ events

    def flush(self, turn_ids: Iterable[str] | None = None) -> None:
        """Nothing to send: publishing here is immediate."""

    def ping(self) -> bool:
        """Always: it lives in this process."""
        return True

    def outage(self) -> str | None:
        """Never: it lives in this process."""
        return None

    def forget(self, session_id: str, turn_ids: Sequence[str]) -> None:
        """Drop a pruned session's turns' buffers, ends, owners and steers."""
        with self._guard:
            for turn_id in turn_ids:
                self._buffers.pop(turn_id, None)
                self._ends.pop(turn_id, None)
                self._owners.pop(turn_id, None)
                self._steers.pop(turn_id, None)
            if session_id not in self._held:
                self._marks.pop(session_id, None)

    def close(self) -> None:
        """Nothing to send or stop: publishing here is immediate, and every embedded
        client of a database shares its coordinator, so it stays usable after."""

    def coalesce(self, token: Event, text: str, fence: int = 0) -> Event | None:
        """Never: a published event is already in readers' hands."""
        return None

    def publish(self, events: Sequence[Event], fence: int = 0, *, now: bool = False) -> None:
        """Append to each turn's replay buffer and wake every reader (always at once, so
        ``now`` changes nothing).  A driver passes its fence; events of a driver older
        than the turn's adopter are dropped."""
        with self._changed:
            for event in events:
                if fence and fence < self._owners.get(event.turn_id, 0):
                    continue
                buffer = self._buffers.get(event.turn_id)
                if buffer is None:
                    buffer = self._buffers[event.turn_id] = []
                    self._evict_ended()
                else:
                    self._buffers.move_to_end(event.turn_id)
                if buffer and event.seq <= buffer[-1].seq:
                    continue  # a re-publication of what is already buffered
                buffer.append(event)
                if event.kind is EventKind.END:
                    self._ends[event.turn_id] = event.seq
            self._changed.notify_all()

    def _evict_ended(self) -> None:
        """Drop the least recently published ended turns' buffers beyond the bound, and
        beyond UNENDED_FACTOR times it any turn's, tokenless ones first."""
        excess = len(self._buffers) - self._retained
        if excess <= 0:
            return
        ended = [
            turn_id
            for turn_id, buffer in self._buffers.items()
            if buffer and self._ends.get(turn_id) == buffer[-1].seq
        ]
        for turn_id in ended[:excess]:
            del self._buffers[turn_id]
            del self._ends[turn_id]
            # Ended, and now out of the window: nothing of it is left to fence or steer.
            self._owners.pop(turn_id, None)
            self._steers.pop(turn_id, None)
        while len(self._buffers) > self._retained * UNENDED_FACTOR:
            # Tokens live only here: first drop buffers without any (a queued turn's, say),
            # whose events a reader gets from the store all the same.
            evicted = next(
                (
                    turn_id
                    for turn_id, buffer in self._buffers.items()
                    if not any(e.kind is EventKind.TOKEN for e in buffer)
                ),
                next(iter(self._buffers)),
            )
            del self._buffers[evicted]
            self._ends.pop(evicted, None)
            self._steers.pop(evicted, None)

    def read_events(self, turn_id: str, after: int, timeout: float) -> list[Event]:
        """Buffered events with seq > ``after``, waiting up to ``timeout`` for one."""
        with self._changed:
            found = self._after(turn_id, after)
            if not found and timeout > 0:
                self._changed.wait_for(lambda: bool(self._after(turn_id, after)), timeout)
                found = self._after(turn_id, after)
            return found

    def _after(self, turn_id: str, after: int) -> list[Event]:
        buffer = self._buffers.get(turn_id)
        if not buffer or buffer[-1].seq <= after:
            return []
        # Seqs are increasing: find the first one past ``after`` from the end.
        start = len(buffer)
        while start > 0 and buffer[start - 1].seq > after:
            start -= 1
        return buffer[start:]

    def wait_end(self, turn_id: str, after: int, timeout: float) -> int:
        """The seq of the newest buffered ``end`` past ``after``, waiting up to ``timeout``."""
        with self._changed:
            self._changed.wait_for(lambda: self._ends.get(turn_id, 0) > after, timeout)
            end = self._ends.get(turn_id, 0)
            return end if end > after else 0

    def wait_ends(self, after: Mapping[str, int], timeout: float, doorbell: str) -> dict[str, int]:
        """The newest buffered ``end`` of each turn of ``after`` past its seq there,
        waiting up to ``timeout`` for one, or for ``doorbell`` to be rung."""

        def ended() -> dict[str, int]:
            return {t: self._ends[t] for t, seq in after.items() if self._ends.get(t, 0) > seq}

        with self._changed:
            self._changed.wait_for(lambda: ended() or doorbell in self._rung, timeout)
            self._rung.discard(doorbell)
            return ended()

    def ring(self, doorbell: str) -> None:
        with self._changed:
            self._rung.add(doorbell)
            self._changed.notify_all()

    def adopt(self, turn_id: str, fence: int) -> int:
        """Make ``fence`` the turn's publisher; returns the newest buffered seq."""
        with self._guard:
            self._owners[turn_id] = max(fence, self._owners.get(turn_id, 0))
            buffer = self._buffers.get(turn_id)
            return buffer[-1].seq if buffer else 0

    def last_seq(self, turn_id: str) -> int:
        """The newest buffered seq of a turn (0 if none)."""
        with self._guard:
            buffer = self._buffers.get(turn_id)
            return buffer[-1].seq if buffer else 0

    def buffer_covers(self, turn_id: str, seq: int) -> bool:
        """The buffer exists and starts at or before ``seq + 1``."""
        with self._guard:
            buffer = self._buffers.get(turn_id)
            return buffer is not None and bool(buffer) and buffer[0].seq <= seq + 1

    # ------------------------------------------------------------------ steers

    def push_steer(self, turn_id: str, steer: Steer) -> None:
        """List a steer the store accepted, if the turn is still buffered here."""
        with self._guard:
            if turn_id in self._buffers:
                self._steers.setdefault(turn_id, []).append(steer)

    def publish_listing_steers(
        self, events: Sequence[Event], fence: int, turn_id: str, cursor: int
    ) -> list[Steer]:
        """Publish ``events``, then give what :meth:`steers_after` gives."""
        self.publish(events, fence)
        return self.steers_after(turn_id, cursor)

    def steers_after(self, turn_id: str, cursor: int, *, fresh: bool = False) -> list[Steer]:
        """The listed steers past ``cursor``, one per position (a steer pushed twice is
        read once, as from Redis), in position order (always current here)."""
        with self._guard:
            listed = {s.position: s for s in self._steers.get(turn_id, ()) if s.position > cursor}
            return [listed[position] for position in sorted(listed)]
