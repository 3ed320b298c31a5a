"""A turn's steer list in Redis: a committed steer is pushed on it, and a driver reads the
list's newest entries at each boundary, or answers from a recent read or a flusher's
report of the list's length without a round trip."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import redis

from parley.coordination import constants as c
from parley.coordination.redis_deltas import CHECKED_TURNS_KEPT, RedisDeltas
from parley.schemas.events import Event
from parley.schemas.records import Steer, SteerKind

log = logging.getLogger("parley.redis")

STEERS_RECHECK_SECONDS = 0.1
"""How long a look at a steer list (a read of it, or a flusher's reply giving its length)
answers for, unless a fresh one is asked for: a streaming driver watches for an
interrupt without a round trip per delta.  A look whose length the flusher last
reported answers for longer while an event of the turn is queued or being sent: the
send's reply reports the length again."""


class RedisSteers(RedisDeltas):
    """The coordinator's steer lists (see the module docstring)."""

    def _start_steers(self) -> None:
        """Per turn: the steer list's length and the steers read from it, and when."""
        self._listed: dict[str, tuple[int, list[Steer], float]] = {}

    def push_steer(self, turn_id: str, steer: Steer) -> None:
        """Append a committed steer to the turn's list (its life renewed: a running
        turn's).  A retried push may list it twice; readers keep one per position."""
        entry = json.dumps(
            {"p": steer.position, "k": steer.kind.value, "t": steer.text}, separators=(",", ":")
        )
        key = c.steers_key(turn_id)
        self._listed.pop(turn_id, None)  # what this process read of it is out of date
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.rpush(key, entry)
            pipe.expire(key, c.IDLE_BUFFER_SECONDS)
            pipe.execute()
        except redis.RedisError:
            log.warning(
                "could not list the steer of %s; its next boundary reads it from the store",
                turn_id,
            )

    def steers_after(self, turn_id: str, cursor: int, *, fresh: bool = False) -> list[Steer]:
        """The listed steers past ``cursor`` from the list's newest ``STEER_TAIL``
        entries: read in one round trip, or (unless ``fresh``) answered from a read or a
        flusher's reply under ``STEERS_RECHECK_SECONDS`` old that shows the list as long
        as that read found it.  None listed if Redis cannot be reached."""
        now = time.monotonic()
        listed = self._listed.get(turn_id)
        if listed is not None and not fresh:
            length, steers, read_at = listed
            heard_length, heard_at = self._heard.get(turn_id, (-1, 0.0))
            if heard_length == length and (
                now - heard_at < STEERS_RECHECK_SECONDS or self._reported_soon(turn_id)
            ):
                # An event of the turn waits for the flusher, or is being sent: the reply
                # will report the list's length.  A streaming driver learns of a steer
                # with the flush after it, and never asks for the list itself meanwhile
                # (that was a round trip per delta once a loaded flusher's round took
                # 100 ms).
                return [s for s in steers if s.position > cursor]
            if now - read_at < STEERS_RECHECK_SECONDS:
                return [s for s in steers if s.position > cursor]
        try:
            pipe = self.redis.pipeline(transaction=False)
            _queue_steer_read(pipe, turn_id)
            length, entries = pipe.execute()
        except redis.RedisError:
            log.warning("cannot read the steer list of %s", turn_id)
            return []
        return self._listed_now(turn_id, length, entries, now, cursor)

    def publish_listing_steers(
        self, events: Sequence[Event], fence: int, turn_id: str, cursor: int
    ) -> list[Steer]:
        """Send ``events`` (and what is queued of the turn before them) now, and read the turn's
        steer list in the same round trip: what :meth:`steers_after` gives."""
        try:
            (length, entries), _twice, at = self._send_queued_with(
                [(fence, e) for e in events],
                lambda pipe: _queue_steer_read(pipe, turn_id),
                [turn_id],
            )
        except redis.RedisError:
            log.warning("could not publish events nor read the steer list of %s", turn_id)
            return []
        return self._listed_now(turn_id, length, entries, at, cursor)

    def _listed_now(
        self, turn_id: str, length: Any, entries: list[bytes], at: float, cursor: int
    ) -> list[Steer]:
        """Keep what a read of the steer list found (``length`` and its newest
        ``entries``), one steer per position; returns those past ``cursor``."""
        by_position = {}
        for entry in entries:
            data = json.loads(entry)
            by_position[data["p"]] = Steer(
                position=data["p"], kind=SteerKind(data["k"]), text=data["t"]
            )
        steers = [by_position[p] for p in sorted(by_position)]
        if len(self._listed) > CHECKED_TURNS_KEPT:
            self._listed.clear()  # a cache of what Redis keeps: read again if needed
        self._listed[turn_id] = (int(length), steers, at)
        return [s for s in steers if s.position > cursor]


def _queue_steer_read(pipe: Any, turn_id: str) -> None:
    """Queue the read of a steer list: its length, then its newest entries."""
    key = c.steers_key(turn_id)
    pipe.llen(key)
    pipe.lrange(key, -c.STEER_TAIL, -1)
