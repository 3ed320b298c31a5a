"""Waiting for many turns' ends on a Redis Cluster, where one blocking read cannot cover
them: a read of several streams must stay in one hash slot, and each turn's ends stream
is in its own turn's slot.

So on a cluster an ends watcher subscribes instead: the script that appends a turn's
``end`` announces it on the turn's sharded channel (``SPUBLISH``, heard only on the node
that holds the turn), and :class:`ShardedEnds` keeps one ``SSUBSCRIBE`` connection per
node, subscribed to the channel of every turn it waits for and to its doorbell's.  A turn
newly waited for is looked up on its ends stream once its subscription is confirmed, for
an end announced before.  What it reports is a hint, as the ends streams are: the
watcher asks the store too (:mod:`parley.gateway.ends_watch`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from typing import Any

import redis

from parley.coordination import constants as c

POLL_SECONDS = 0.05
"""How long one look at the nodes' subscriptions waits at most: redis-py shares a wait
among the nodes in turn, so a message on one node waits for the others' share of it."""
CONFIRM_SECONDS = 1.0
"""How long a wait lets new subscriptions be confirmed before it looks up what their
turns' ends streams hold (then each wait's store recheck covers what it missed)."""

_ENDED = c.ended_channel("").split("{")[0]  # what every turn's ended channel starts with


def ring(client: Any, doorbell: str) -> None:
    """Wake the watcher waiting on ``doorbell``."""
    client.spublish(c.doorbell_key(doorbell), "")


class ShardedEnds:
    """The ends of the turns one watcher waits for, by sharded pub/sub (see the module
    docstring), woken by ``doorbell``.  One waiter at a time: the watcher's thread."""

    def __init__(self, client: Any, doorbell: str) -> None:
        self._client = client
        self._bell = c.doorbell_key(doorbell)
        self._pubsub: Any = None
        self._turns: set[str] = set()  # the turns whose ended channel is subscribed
        self._guard = threading.Lock()

    def close(self) -> None:
        with self._guard:
            self._reset()

    def wait(self, after: Mapping[str, int], timeout: float) -> dict[str, int]:
        """The newest ``end`` past its seq in ``after`` of each turn announced within
        ``timeout`` (or announced before, for a turn new to this watcher); returns at the
        first one, or at a ring of the doorbell.  Raises ``redis.ConnectionError`` (the
        subscriptions are then made afresh by the next call)."""
        with self._guard:
            try:
                return self._wait(after, timeout)
            except Exception as exc:
                self._reset()
                if isinstance(exc, redis.RedisError):
                    raise
                raise redis.ConnectionError(f"sharded pub/sub: {exc}") from exc

    def _wait(self, after: Mapping[str, int], timeout: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        ends: dict[str, int] = {}
        rung = self._subscribe(after, ends)
        while not ends and not rung:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            message = self._pubsub.get_sharded_message(timeout=min(POLL_SECONDS, left))
            while message is not None:
                rung |= self._heard(message, after, ends)
                # Whatever else arrived already goes with it.
                message = self._pubsub.get_sharded_message()
        return ends

    def _subscribe(self, after: Mapping[str, int], ends: dict[str, int]) -> bool:
        """Subscribe to the ended channels of the turns in ``after`` not subscribed yet
        (and to the doorbell's, at first), unsubscribe from the others, and note in
        ``ends`` what the new turns' ends streams hold past their seqs, looked up once
        their subscriptions are confirmed; whether the doorbell rang meanwhile."""
        channels = []
        if self._pubsub is None:
            self._pubsub = self._client.pubsub()
            channels.append(self._bell)
        new = [turn_id for turn_id in after if turn_id not in self._turns]
        gone = [turn_id for turn_id in self._turns if turn_id not in after]
        channels += [c.ended_channel(t) for t in new]
        if gone:
            self._pubsub.sunsubscribe(*(c.ended_channel(t) for t in gone))
            self._turns.difference_update(gone)
        if not channels:
            return False
        self._pubsub.ssubscribe(*channels)
        self._turns.update(new)
        rung = self._confirm(set(channels), after, ends)
        self._earlier_ends(new, after, ends)
        return rung

    def _confirm(self, channels: set[str], after: Mapping[str, int], ends: dict[str, int]) -> bool:
        """Read until each of ``channels``' subscriptions is confirmed (at most
        :data:`CONFIRM_SECONDS`): an end published after that reaches this watcher.  What
        else arrives meanwhile is heard; whether the doorbell rang."""
        rung = False
        deadline = time.monotonic() + CONFIRM_SECONDS
        while channels and time.monotonic() < deadline:
            message = self._pubsub.get_sharded_message(timeout=POLL_SECONDS)
            if message is None:
                continue
            if _text(message["type"]) == "ssubscribe":
                channels.discard(_text(message["channel"]))
            else:
                rung |= self._heard(message, after, ends)
        return rung

    def _earlier_ends(
        self, turns: list[str], after: Mapping[str, int], ends: dict[str, int]
    ) -> None:
        """Note in ``ends`` those of ``turns`` whose ends stream holds an ``end`` past
        their seq in ``after``: one round trip per node."""
        if not turns:
            return
        pipe = self._client.pipeline(transaction=False)
        for turn_id in turns:
            pipe.xrevrange(c.ends_key(turn_id), count=1)
        for turn_id, newest in zip(turns, pipe.execute(), strict=True):
            if newest:
                seq = c.seq_of_entry(newest[0][0])
                if seq > after[turn_id]:
                    ends[turn_id] = max(seq, ends.get(turn_id, 0))

    def _heard(
        self, message: dict[str, Any], after: Mapping[str, int], ends: dict[str, int]
    ) -> bool:
        """Note an end ``message`` announces in ``ends``; whether it is a ring instead."""
        if _text(message["type"]) != "smessage":
            return False  # (a subscription's confirmation)
        name = _text(message["channel"])
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
        if pubsub is not None:
            # A connection already broken has nothing more to release.
            with contextlib.suppress(Exception):
                pubsub.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
