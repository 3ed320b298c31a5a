"""Waiting for turns to end, for every request of a gateway process on one thread.

A request that waits for a turn's result (``GET /v1/turns/{id}/result?wait=N``) needs
only the turn's end, not its tokens.  :class:`EndsWatcher` follows the ends streams of
every turn some request waits for with one blocking read of them all (the coordinator's
``wait_ends``), so a thousand waiting requests cost one thread and one Redis connection,
not a feed each that reads every token.  A request for a turn the read does not cover yet
rings the watcher's doorbell, which the same read watches, so the read starts over with
the new turn at once.

What the watcher reports is a hint, as the ends streams are: the caller asks the store
whether the turn ended, and asks it again every :data:`STORE_RECHECK_SECONDS` whatever
the streams say (a flushed Redis loses the signal, never the end).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid

from parley.ports.backend import Coordinator

log = logging.getLogger("parley.gateway.ends")

READ_SECONDS = 1.0
"""How long one blocking read of the ends streams lasts at most."""
STORE_RECHECK_SECONDS = 2.0
"""How long a waiter trusts the streams' silence before asking the store again."""


class EndsWatcher:
    """The ends of the turns this process's requests wait for (see the module
    docstring)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._doorbell = f"gateway-{uuid.uuid4().hex[:16]}"
        # Per turn, each waiting request's future and the end seq it waits past.
        self._waiters: dict[str, dict[asyncio.Future[int], int]] = {}
        self._watching: frozenset[str] = frozenset()  # the turns the current read covers
        self._guard = threading.Lock()
        self._waiting = threading.Event()  # set when a turn is added to an idle watcher
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def watched(self) -> int:
        """Turns some request waits for now (for tests and metrics)."""
        with self._guard:
            return len(self._waiters)

    async def end_after(self, turn_id: str, after: int, timeout: float) -> int:
        """The seq of an ``end`` of the turn past ``after`` once one is published, or 0
        if none is within ``timeout`` seconds (at most :data:`STORE_RECHECK_SECONDS`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        with self._guard:
            self._waiters.setdefault(turn_id, {})[future] = after
            ring = self._thread is not None and turn_id not in self._watching
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="parley-ends-watch", daemon=True
                )
                self._thread.start()
            self._waiting.set()
        try:
            if ring:
                await asyncio.to_thread(self._coordinator.ring, self._doorbell)
            async with asyncio.timeout(min(timeout, STORE_RECHECK_SECONDS)):
                return await future
        except TimeoutError:
            return 0
        finally:
            with self._guard:
                self._forget(turn_id, [future])

    def close(self) -> None:
        """Stop the thread (within a read) and wake it."""
        self._closed.set()
        self._waiting.set()
        if self._thread is not None:
            self._coordinator.ring(self._doorbell)
            self._thread.join(READ_SECONDS + 1)

    def _run(self) -> None:
        while not self._closed.is_set():
            with self._guard:
                after = {
                    turn_id: min(waiting.values()) for turn_id, waiting in self._waiters.items()
                }
                self._watching = frozenset(after)
                if not after:
                    self._waiting.clear()
            if not after:
                self._waiting.wait(READ_SECONDS)
                continue
            try:
                ends = self._coordinator.wait_ends(after, READ_SECONDS, self._doorbell)
            except Exception:  # the thread serves every waiter: it must go on
                log.exception("could not read the ends of %d turn(s)", len(after))
                self._closed.wait(READ_SECONDS)
                continue
            if ends:
                self._answer(ends)

    def _answer(self, ends: dict[str, int]) -> None:
        """Resolve the futures of the requests waiting past an end now published."""
        answered: list[tuple[asyncio.Future[int], int]] = []
        with self._guard:
            for turn_id, seq in ends.items():
                waiting = self._waiters.get(turn_id, {})
                past = [future for future, after in waiting.items() if seq > after]
                answered += [(future, seq) for future in past]
                # Taken off at once: the next read must not find the same end for them
                # again before their requests have run.
                self._forget(turn_id, past)
        for future, seq in answered:
            future.get_loop().call_soon_threadsafe(_resolve, future, seq)

    def _forget(self, turn_id: str, futures: list[asyncio.Future[int]]) -> None:
        """Stop waiting for the turn's end on behalf of ``futures`` (under the guard)."""
        waiting = self._waiters.get(turn_id, {})
        for future in futures:
            waiting.pop(future, None)
        if not waiting:
            self._waiters.pop(turn_id, None)


def _resolve(future: asyncio.Future[int], seq: int) -> None:
    if not future.done():  # (its request may have timed out meanwhile)
        future.set_result(seq)
