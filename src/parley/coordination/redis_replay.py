"""A turn's replay buffer in Redis: its stream of events (read after a seq, waiting for
more), its ends stream, and its publisher, whom a driver with a newer fence adopts."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import redis

from parley.coordination import constants as c
from parley.coordination.redis_deltas import RedisDeltas
from parley.coordination.redis_reachability import Reachability
from parley.coordination.redis_sharded_ends import ShardedEnds, ring
from parley.schemas.events import Event

log = logging.getLogger("parley.redis")


class RedisReplay(RedisDeltas):
    """The coordinator's replay buffers (see the module docstring)."""

    _blocking: Any
    _doorbells: dict[str, Any]
    _sharded_ends: dict[str, ShardedEnds]  # on a cluster: each doorbell's watcher
    reachability: Reachability

    def read_events(self, turn_id: str, after: int, timeout: float) -> list[Event]:
        """Buffered events with seq > ``after``, waiting up to ``timeout`` for one."""
        entries = self._entries_after(c.events_key(turn_id), after, timeout)
        return [Event.from_json(json.loads(fields[b"e"])) for _id, fields in entries]

    def wait_end(self, turn_id: str, after: int, timeout: float) -> int:
        """The seq of the newest ``end`` past ``after`` on the turn's ends stream, waiting
        up to ``timeout`` (0 if none, or if Redis is unreachable)."""
        self.flush([turn_id])  # what this process still holds counts too
        entries = self._entries_after(c.ends_key(turn_id), after, timeout)
        return c.seq_of_entry(entries[-1][0]) if entries else 0

    def wait_ends(self, after: Mapping[str, int], timeout: float, doorbell: str) -> dict[str, int]:
        """The newest ``end`` past its seq in ``after`` of each turn's ends stream, from
        one blocking read of them all and the doorbell's stream (read past the last entry
        this process saw, so a ring sent before the read started still wakes it).  ``{}``
        if Redis is unreachable (after waiting out the timeout)."""
        self.flush(after)  # what this process still holds counts too
        try:
            if self.cluster:  # no read covers many slots: each doorbell's watcher subscribes
                ends = self._sharded_watcher(doorbell).wait(after, timeout)
            else:
                ends = self._read_ends(after, timeout, doorbell)
        except redis.RedisError as exc:
            self.reachability.failed(exc)
            time.sleep(timeout)
            return {}
        self.reachability.answered()
        return ends

    def _read_ends(self, after: Mapping[str, int], timeout: float, doorbell: str) -> dict[str, int]:
        """:meth:`wait_ends` on one server: one blocking read of the ends streams and the
        doorbell's."""
        bell = c.doorbell_key(doorbell)
        streams = {c.ends_key(turn_id): f"{seq}-0" for turn_id, seq in after.items()}
        streams[bell] = self._doorbells.get(doorbell, "0-0")
        found = self._blocking.xread(streams, block=max(1, int(timeout * 1000)))
        ends: dict[str, int] = {}
        for key, entries in found or []:
            name = key.decode() if isinstance(key, bytes) else key
            newest = entries[-1][0]
            if name == bell:
                self._doorbells[doorbell] = newest
            else:
                ends[c.tagged_id(name)] = c.seq_of_entry(newest)
        return ends

    def _sharded_watcher(self, doorbell: str) -> ShardedEnds:
        """On a cluster, the doorbell's watcher (made at its first wait)."""
        watcher = self._sharded_ends.get(doorbell)
        if watcher is None:
            watcher = self._sharded_ends.setdefault(doorbell, ShardedEnds(self.redis, doorbell))
        return watcher

    def ring(self, doorbell: str) -> None:
        """Add to the doorbell's stream (one entry kept; it expires with its watcher), or
        on a cluster announce it on the doorbell's channel."""
        try:
            if self.cluster:
                ring(self.redis, doorbell)
                return
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(c.doorbell_key(doorbell), {"r": ""}, maxlen=1)
            pipe.expire(c.doorbell_key(doorbell), c.DOORBELL_SECONDS)
            pipe.execute()
        except redis.RedisError as exc:
            # The watcher's next poll takes the turn in (its wait is bounded by it).
            self.reachability.failed(exc)

    def _entries_after(self, key: str, after: int, timeout: float) -> list[Any]:
        """A stream's entries with ids above ``<after>-0``, blocking up to ``timeout`` for
        one; none if Redis cannot be reached (after waiting out the timeout)."""
        try:
            if timeout > 0:
                found = self._blocking.xread({key: f"{after}-0"}, block=max(1, int(timeout * 1000)))
                entries = list(found[0][1]) if found else []
            else:
                entries = list(self.redis.xrange(key, min=f"({after}-0"))
        except redis.RedisError as exc:
            self.reachability.failed(exc)
            if timeout > 0:
                time.sleep(timeout)
            return []
        self.reachability.answered()
        return entries

    def adopt(self, turn_id: str, fence: int) -> int:
        """Make ``fence`` the turn's publisher and return the buffer's newest seq: from
        now on a driver with an older fence cannot add to the buffer."""
        self.flush([turn_id])  # what this process still holds counts too
        try:
            return int(
                self.scripts.adopt(
                    keys=[c.owner_key(turn_id), c.events_key(turn_id), c.steers_key(turn_id)],
                    args=[fence, c.IDLE_BUFFER_SECONDS],
                )
            )
        except redis.RedisError:
            log.warning("cannot adopt the buffer of %s; numbering from the store", turn_id)
            return 0

    def last_seq(self, turn_id: str) -> int:
        """The newest buffered seq of a turn (0 if none or Redis is unreachable)."""
        self.flush([turn_id])  # what this process still holds counts too
        try:
            last = self.redis.xrevrange(c.events_key(turn_id), count=1)
        except redis.RedisError as exc:
            self.reachability.failed(exc)
            return 0
        self.reachability.answered()
        return c.seq_of_entry(last[0][0]) if last else 0

    def buffer_covers(self, turn_id: str, seq: int) -> bool:
        """The turn's stream exists and starts at or before ``seq + 1``."""
        try:
            first = self.redis.xrange(c.events_key(turn_id), count=1)
        except redis.RedisError as exc:
            self.reachability.failed(exc)
            return False
        self.reachability.answered()
        return bool(first) and c.seq_of_entry(first[0][0]) <= seq + 1
