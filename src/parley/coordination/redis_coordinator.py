"""The Redis coordinator: session locks with a heartbeat (:mod:`.redis_locks`), per-turn
replay buffers with pub/sub (:mod:`.redis_replay`, fed by :mod:`.redis_deltas`), per-turn
steer lists (:mod:`.redis_steers`) and each session's work mark and kick flags (here),
behind the same port as the in-process coordinator.

Redis failures never fail a turn: PostgreSQL is the truth, and readers fall back to it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from redis.cluster import RedisCluster

from parley.coordination import constants as c
from parley.coordination.redis_clients import address_of, is_cluster, open_client
from parley.coordination.redis_locks import Heartbeat, RedisLock
from parley.coordination.redis_reachability import Reachability
from parley.coordination.redis_replay import RedisReplay
from parley.coordination.redis_scripts import Scripts
from parley.coordination.redis_steers import RedisSteers
from parley.ports.backend import Coordinator
from parley.schemas.events import Event

log = logging.getLogger("parley.redis")

BLOCKING_SOCKET_SECONDS = 10.0
COMMAND_SOCKET_SECONDS = 5.0
"""How long any other command may take, connecting included: a submission marks its work
while it holds its session's row, and a half-open connection must not hold it for long."""
FORGET_BATCH = 512  # keys per UNLINK: a pruned session of many turns is not one huge command
MAX_CONNECTIONS = 100
"""How many connections each of a coordinator's two pools opens at most unless told
otherwise (redis-py's own default): one per thread talking to Redis at that moment.  A
worker sizes its pools to the turns it drives at once (:mod:`parley.runtime.concurrency`)."""


class RedisCoordinator(RedisSteers, RedisReplay, Coordinator):
    """The coordinator port on Redis."""

    def __init__(
        self,
        url: str,
        *,
        replay_seconds: int = c.ENDED_BUFFER_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
        flush_seconds: float = c.STREAM_FLUSH_SECONDS,
    ) -> None:
        """``replay_seconds``: how long the replay buffer of a turn this process ends is
        kept after its end (a driver's setting).  ``max_connections``: how many
        connections each of its pools (commands, blocking reads) may open.
        ``flush_seconds``: how often at most queued events are sent (0: as they come)."""
        self.url = url
        self.cluster = is_cluster(url)
        self.replay_seconds = replay_seconds
        # redis-py's return types depend on decode settings; results are converted here.
        self.redis: Any = open_client(
            url, max_connections=max_connections, socket_timeout=COMMAND_SOCKET_SECONDS
        )
        # Blocking stream reads (at most POLL seconds each) need a longer socket timeout
        # than the default, yet a finite one, so a half-open connection cannot hang them.
        self._blocking: Any = open_client(
            url, max_connections=max_connections, socket_timeout=BLOCKING_SOCKET_SECONDS
        )
        self.scripts = Scripts(self.redis)
        self.heartbeat = Heartbeat(self.redis, self.scripts, self.pipeline, cluster=self.cluster)
        self.reachability = Reachability(address_of(url))
        self._start_deltas(flush_seconds)
        self._start_steers()
        self._doorbells: dict[str, Any] = {}  # each doorbell's newest entry id seen
        self._sharded_ends = {}

    def close(self) -> None:
        """Flush what is queued and stop the flusher and the heartbeat."""
        self.heartbeat.stop()
        self._stop_deltas()
        for watcher in list(self._sharded_ends.values()):
            watcher.close()
        self.redis.close()
        self._blocking.close()

    def ping(self) -> bool:
        """Whether Redis answers now."""
        try:
            if self.cluster:  # (its primaries: a replica down or gone is no outage)
                return bool(self.redis.ping(target_nodes=RedisCluster.PRIMARIES))
            return bool(self.redis.ping())
        except redis.RedisError:
            return False

    def outage(self) -> str | None:
        """Why the latest read of Redis failed, naming it (None: it answered)."""
        return self.reachability.outage()

    def forget(self, session_id: str, turn_ids: Sequence[str]) -> None:
        """UNLINK a pruned session's keys and its turns' (the lock is left to expire: a
        driver that bounced in may hold it for a moment)."""
        keys = [c.work_key(session_id), c.kicked_key(session_id), c.kick_pending_key(session_id)]
        for turn_id in turn_ids:
            keys += [c.events_key(turn_id), c.ends_key(turn_id)]
            keys += [c.owner_key(turn_id), c.steers_key(turn_id)]
        try:
            for start in range(0, len(keys), FORGET_BATCH):
                self.redis.unlink(*keys[start : start + FORGET_BATCH])
        except redis.RedisError as exc:
            # Every one of these keys expires on its own: a Redis out of reach only
            # keeps them until then.
            log.warning("could not drop the Redis keys of pruned session %s: %s", session_id, exc)

    # ------------------------------------------------------------------ locks and work marks

    def try_lock(self, session_id: str) -> RedisLock | None:
        """The session's lock, or None if another driver holds it (or Redis is down)."""
        token = uuid.uuid4().hex
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(c.lock_key(session_id), token, nx=True, px=c.LOCK_TTL_MS)
            pipe.get(c.work_key(session_id))
            taken, mark = pipe.execute()
        except redis.RedisError:
            log.warning("cannot reach Redis to lock session %s", session_id)
            return None
        return RedisLock(self.heartbeat, session_id, token, mark) if taken else None

    def mark_work(self, session_id: str, events: Sequence[Event] = ()) -> bool:
        """Move the session's work mark, publishing ``events`` (and what is queued before
        them) in the same round trip.  Returns whether to kick: not while the session's
        kick-pending flag is up, from an earlier kick until a driver lets go of the
        session (that driver sees this work through the work mark).  A lost mark or kick
        only delays a turn until the sweeper's next look."""

        def mark(pipe: Any) -> None:
            # A fresh random mark, not a counter: a counter that expired (a drive longer
            # than its life) could count back up to the value a driver holds.
            pipe.set(c.work_key(session_id), uuid.uuid4().hex, ex=c.WORK_MARK_SECONDS)
            pipe.set(c.kick_pending_key(session_id), 1, nx=True, ex=c.KICK_PENDING_SECONDS)

        try:
            replies, twice, _at = self._send_queued_with([(0, e) for e in events], mark)
        except redis.RedisError:
            # (Not a warning: the kick that follows reports whether it reached the fleet.)
            log.info("could not mark work for session %s; kicking anyway", session_id)
            return True
        # Run twice, the second SET found the first one's flag: kick to be safe.
        return bool(replies[-1]) or twice

    def unattended(self, session_ids: Sequence[str]) -> list[str]:
        """Of ``session_ids``, those whose lock no driver holds and that no kick sent in
        the last ``KICK_GRACE_SECONDS`` is on its way to: what a sweeper must kick.  A
        kick waiting in the queue behind others is not lost, and kicking its session
        again would only cost the fleet a task.  One round trip."""

        def look(pipe: Any) -> None:
            for session_id in session_ids:
                pipe.exists(c.lock_key(session_id))
                pipe.pttl(c.kick_pending_key(session_id))

        replies, _ = self.pipeline(look)
        # The flag is set with KICK_PENDING_SECONDS to live (never refreshed while up), so
        # what it has left tells its age; -2 means no flag, -1 cannot happen.
        fresh_above = 1000 * (c.KICK_PENDING_SECONDS - c.KICK_GRACE_SECONDS)
        return [
            session_id
            for session_id, locked, left in zip(
                session_ids, replies[::2], replies[1::2], strict=True
            )
            if not locked and not left > fresh_above
        ]

    def claim_kick(self, session_id: str) -> bool:
        """True at most once per throttle period per session (for the sweeper)."""
        return bool(
            self.redis.set(c.kicked_key(session_id), 1, nx=True, ex=c.KICK_THROTTLE_SECONDS)
        )
