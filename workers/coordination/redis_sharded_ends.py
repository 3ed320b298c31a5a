"""Waiting for many turns' ends on a Redis Cluster, where one blocking read cannot cover
them: a read of several streams must stay in one hash slot, and each turn's ends stream
is in its own turn's slot.

So on a cluster an ends watcher subscribes instead: the script that appends a turn's
``end`` announces it on the turn's sharded channel (``SPUBLISH``, heard only on the node
that holds the turn), and :class:`ShardedEnds` keeps one ``SSUBSCRIBE`` connection per
node, subscribed to the channel of every turn it waits for and to its doorbell's.  A turn
newly waited for is looked up on its ends stream once, after its subscription was sent,
for an end announced before.  What it reports is a hint, as the ends streams are: the
watcher asks the store too (:mod:`parley.gateway.ends_watch`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

from workers.coordination import constants as c

POLL_SECONDS = 0.05
"""How long one look at the nodes' subscriptions waits at most: redis-py shares a wait
among the nodes in turn, so a message on one node waits for the others' share of it."""

_ENDED = c.ended_channel("").split("{")[0]  # what every turn's ended channel starts with


class ShardedEnds:
    """The ends of the turns one watcher waits for, by sharded pub/sub (see the module
    docstring).  One waiter at a time: the watcher's thread."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._pubsub: Any = None
        self._turns: set[str] = set()  # the turns whose ended channel is subscribed
        self._bell: str | None = None
        self._guard = threading.Lock()

    def close(self) -> None:
        with self._guard:
            self._reset()

    def ring(self, doorbell: str) -> None:
        """Wake the watcher waiting on ``doorbell``."""
        self._client.spublish(c.doorbell_key(doorbell), "")

    def wait(self, after: Mapping[str, int], timeout: float, doorbell: str) -> dict[str, int]:
        """The newest ``end`` past its seq in ``after`` of each turn announced within
        ``timeout`` (or announced before, for a turn new to this watcher); returns at the
        first one, or at a ring of ``doorbell``.  Raises ``RedisError`` (the
        subscriptions are then made afresh by the next call)."""
        with self._guard:
            try:
                return self._wait(after, timeout, doorbell)
            except Exception:
                self._reset()
                raise

    def _wait(self, after: Mapping[str, int], timeout: float, doorbell: str) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        ends = self._earlier_ends(self._subscribe(after, doorbell), after)
        rung = False
        while not ends and not rung:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            message = self._pubsub.get_sharded_message(
                ignore_subscribe_messages=True, timeout=min(POLL_SECONDS, left)
            )
            while message is not None:
                rung |= self._heard(message, after, ends)
                # Whatever else arrived already goes with it.
                message = self._pubsub.get_sharded_message(ignore_subscribe_messages=True)
        return ends

    def _subscribe(self, after: Mapping[str, int], doorbell: str) -> list[str]:
        """Subscribe to the ended channels of the turns in ``after`` not subscribed yet
        (and to the doorbell's), unsubscribe from the others; returns the new turns."""
        if self._pubsub is None:
            self._pubsub = self._client.pubsub()
        bell = c.doorbell_key(doorbell)
        if self._bell != bell:
            if self._bell is not None:
                self._pubsub.sunsubscribe(self._bell)
            self._pubsub.ssubscribe(bell)
            self._bell = bell
        new = [turn_id for turn_id in after if turn_id not in self._turns]
        gone = [turn_id for turn_id in self._turns if turn_id not in after]
        if new:
            self._pubsub.ssubscribe(*(c.ended_channel(t) for t in new))
        if gone:
            self._pubsub.sunsubscribe(*(c.ended_channel(t) for t in gone))
        self._turns.difference_update(gone)
        self._turns.update(new)
        return new

    def _earlier_ends(self, turns: list[str], after: Mapping[str, int]) -> dict[str, int]:
        """Of ``turns``, those whose ends stream holds an ``end`` past their seq in
        ``after`` (announced before their subscription): one round trip per node."""
        if not turns:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for turn_id in turns:
            pipe.xrevrange(c.ends_key(turn_id), count=1)
        ends: dict[str, int] = {}
        for turn_id, newest in zip(turns, pipe.execute(), strict=True):
            if newest:
                seq = int(newest[0][0].split(b"-")[0])
                if seq > after[turn_id]:
                    ends[turn_id] = seq
        return ends

    def _heard(
        self, message: dict[str, Any], after: Mapping[str, int], ends: dict[str, int]
    ) -> bool:
        """Note an end ``message`` announces in ``ends``; whether it is a ring instead."""
        channel = message["channel"]
        name = channel.decode() if isinstance(channel, bytes) else str(channel)
        if not name.startswith(_ENDED):
            return name == self._bell
        turn_id = c.tagged_id(name)
        seq = int(message["data"])
        if turn_id in after and seq > after[turn_id]:
            ends[turn_id] = max(seq, ends.get(turn_id, 0))
        return False

    def _reset(self) -> None:
        """Drop the subscriptions (after a failure, or to close)."""
        pubsub, self._pubsub = self._pubsub, None
        self._turns.clear()
        self._bell = None
        if pubsub is not None:
            # A connection already broken has nothing more to release.
            with contextlib.suppress(Exception):
                pubsub.close()
