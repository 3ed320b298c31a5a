"""Reading a turn's events from any ``seq``: the replay buffer first, the store for what
the buffer no longer holds, then live.

Durable events are committed in seq order, so once the store holds an event with seq k,
every durable event below k that will ever exist is stored too: a gap the buffer cannot
fill is then made only of tokens, which are allowed to age out of the replay window.

A driver commits before it publishes, so the store can be ahead of a live buffer by the
events still on their way.  While the buffer covers the reader's position the reader
waits for it; it turns to the store only for what the buffer lost, or once the buffer
has said nothing for ``PATIENCE_SECONDS``.  A gap above what the store has settled is
never jumped, however long it lasts: it may hold a durable event whose batch Redis lost
and whose step has not committed yet.  The next commit (a step, the end, or a new
driver's claim) settles it.  While the buffer is live the reader blocks on
it and takes what the blocking read returns (one round trip per batch); the store is
asked whether the turn is over only after a poll of silence.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from parley.ports.backend import Coordinator
from parley.schemas.errors import StoreError
from parley.schemas.events import Event, EventKind
from parley.store.sql_store import SqlStore

POLL_SECONDS = 0.5
PATIENCE_SECONDS = 2.0
GAP_POLL_SECONDS = 0.1


def follow(
    turn_id: str,
    after: int,
    *,
    coordinator: Coordinator,
    store: SqlStore,
    driver_failure: Callable[[], BaseException | None] = lambda: None,
    stop: threading.Event | None = None,
) -> Iterator[Event]:
    """Every event of the turn with seq > ``after``, once each and in order, until its end.

    A turn that is resumed after an ``end`` goes on: the iterator stops only at an ``end``
    that nothing follows while the turn is terminal.  ``driver_failure`` reports a driver
    of this process that died (embedded), so a reader is told instead of waiting forever.
    Once ``stop`` is set the iterator ends within a poll, end or not (a reader that
    nobody needs any more)."""
    reader = _Reader(turn_id, after, coordinator, store, driver_failure)
    while stop is None or not stop.is_set():
        batch = reader.next_batch()
        if batch is None:
            return
        if not batch:
            continue
        reader.progressed = time.monotonic()
        for event in batch:
            yield event
            reader.last = event.seq
        if (
            batch[-1].kind is EventKind.END
            and _ended(turn_id, reader.last, store)
            and not coordinator.read_events(turn_id, reader.last, timeout=0)
        ):
            return


class _Reader:
    """Where one reader of a turn is, and how it gets its next batch of events."""

    def __init__(
        self,
        turn_id: str,
        after: int,
        coordinator: Coordinator,
        store: SqlStore,
        driver_failure: Callable[[], BaseException | None],
    ) -> None:
        self.turn_id = turn_id
        self.last = after
        self.progressed = time.monotonic()
        self._coordinator = coordinator
        self._store = store
        self._driver_failure = driver_failure
        # While the buffer is live and covers the reader, the reader blocks on it and
        # takes what the blocking read returns: one round trip per batch.  The store is
        # asked whether the turn is over the first time a reader from ``after`` > 0 runs
        # out of events (it may have started past the end), then only after a poll of
        # silence: a reader that reads the ``end`` itself stops on it.
        self._live = False
        # A reader from the start cannot be past the end: it stops on the end it reads.
        # So it goes straight to blocking on a live buffer, sparing the store a read (and
        # the buffer two) just as the turn's driver starts.
        self._asked = after == 0

    def next_batch(self) -> list[Event] | None:
        """The next events in order (empty: none yet), or None once the turn is over."""
        if self._live and self._asked:
            fresh = self._coordinator.read_events(self.turn_id, self.last, timeout=POLL_SECONDS)
            if fresh and fresh[0].seq == self.last + 1:
                return _contiguous(fresh, self.last)
            if not fresh and self._over():
                return None
        patient = time.monotonic() - self.progressed < PATIENCE_SECONDS
        batch, self._live = _next_batch(
            self.turn_id, self.last, self._coordinator, self._store, patient=patient
        )
        if batch:
            return batch
        if not self._live or not self._asked:
            self._asked = True
            if self._over():
                return None
        if not self._live:
            _wait_past_gap(self.turn_id, self.last, self._coordinator)
        return []

    def _over(self) -> bool:
        return _over(self.turn_id, self.last, self._store, self._driver_failure)


def _wait_past_gap(turn_id: str, last: int, coordinator: Coordinator) -> None:
    """Wait a poll for the buffer; if its events start past a gap that only a commit
    closes (and nothing announces commits), wait a store poll instead of spinning."""
    ahead = coordinator.read_events(turn_id, last, timeout=POLL_SECONDS)
    if ahead and ahead[0].seq != last + 1:
        time.sleep(GAP_POLL_SECONDS)


def _over(
    turn_id: str,
    last: int,
    store: SqlStore,
    driver_failure: Callable[[], BaseException | None],
) -> bool:
    """Whether the turn is over for this reader; ``StoreError`` if the driver of this
    process died (embedded), so the reader is told instead of waiting forever."""
    if _ended(turn_id, last, store):
        return True
    failure = driver_failure()
    if failure is not None:
        raise StoreError(f"the driver of this turn stopped: {failure}") from failure
    return False


def _next_batch(
    turn_id: str, last: int, coordinator: Coordinator, store: SqlStore, *, patient: bool
) -> tuple[list[Event], bool]:
    """The next events after ``last``, and whether the buffer is live for this reader
    (it supplied them, or it covers ``last`` and what comes next is on its way)."""
    buffered = coordinator.read_events(turn_id, last, timeout=0)
    if buffered and buffered[0].seq == last + 1:
        return _contiguous(buffered, last), True
    if patient and not buffered and coordinator.buffer_covers(turn_id, last):
        return [], True
    stored = store.events_after(turn_id, last)
    # The buffer once more, read after the store: a token published before a commit the
    # store already shows is in it then.  (Read only before, it could lack a token whose
    # step the store has, and the reader would step over the token.)
    buffered = coordinator.read_events(turn_id, last, timeout=0) or buffered
    # Committed up to here: any durable event below this seq is in `stored`.  Above it, a
    # seq missing from the buffer may be a durable event still uncommitted (its batch was
    # lost), so the reader does not jump such a gap until the store has settled it.
    settled = stored[-1].seq if stored else last
    merged = {e.seq: e for e in buffered}
    merged.update((e.seq, e) for e in stored)
    batch: list[Event] = []
    previous = last
    for seq in sorted(merged):
        if seq != previous + 1 and seq - 1 > settled:
            break
        batch.append(merged[seq])
        previous = seq
    return batch, False


def _contiguous(events: list[Event], last: int) -> list[Event]:
    run: list[Event] = []
    for event in events:
        if event.seq != last + 1:
            break
        run.append(event)
        last = event.seq
    return run


def _ended(turn_id: str, last: int, store: SqlStore) -> bool:
    """The turn is terminal and its final event has been read."""
    state = store.run_state(turn_id)
    if not state.status.terminal:
        return False
    return not store.events_after(turn_id, last)
