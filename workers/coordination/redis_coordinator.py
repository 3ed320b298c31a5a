"""The Redis coordinator: session locks with a heartbeat, per-turn replay buffers with
pub/sub, and per-turn steer lists, behind the same port as the in-process coordinator.

Events are batched: ``publish`` queues them and a flusher thread sends whatever has
accumulated in one pipeline of Lua calls (append to the turn's stream, publish the batch
on its channel, report the length of its steer list), so under load one round trip
carries many deltas, and an idle stream sends each delta at once.  Redis failures never fail a turn:
PostgreSQL is the truth, and readers fall back to it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import redis

from schemas.events import Event, EventKind
from schemas.records import Steer, SteerKind
from workers.coordination import constants as c
from workers.coordination.redis_reachability import Reachability, redis_address
from workers.ports.backend import Coordinator

log = logging.getLogger("parley.redis")


def _lua(name: str) -> str:
    """The source of a script in ``workers/coordination/lua/`` (each file says what its
    KEYS and ARGV are)."""
    return resources.files("workers.coordination").joinpath("lua", f"{name}.lua").read_text("utf-8")


# Read once, at import; registered with each client by _Scripts.
APPEND_AND_PUBLISH = _lua("append_and_publish")
EXTEND_LOCK = _lua("extend_lock")
ADOPT_TURN = _lua("adopt_turn")
RELEASE_LOCK = _lua("release_lock")
LUA_SCRIPTS = ("append_and_publish", "extend_lock", "adopt_turn", "release_lock")
"""The files in ``workers/coordination/lua/`` this module reads (the package data a wheel
must ship)."""


STEERS_RECHECK_SECONDS = 0.1
"""How long a look at a steer list (a read of it, or a flusher's reply giving its length)
answers for, unless a fresh one is asked for: a streaming driver watches for an
interrupt without a round trip per delta."""
COALESCED_TEXT_LIMIT = 4_096
"""A queued token event takes no more deltas once its text is this long: each merge copies
the text, and a stalled Redis must not make that quadratic."""
BLOCKING_SOCKET_SECONDS = 10.0
COMMAND_SOCKET_SECONDS = 5.0
FORGET_BATCH = 512  # keys per UNLINK: a pruned session of many turns is not one huge command
"""How long any other command may take, connecting included: a submission marks its work
while it holds its session's row, and a half-open connection must not hold it for long."""
MAX_CONNECTIONS = 100
"""How many connections each of a coordinator's two pools opens at most unless told
otherwise (redis-py's own default): one per thread talking to Redis at that moment.  A
worker sizes its pools to the turns it drives at once (:mod:`workers.runtime.concurrency`)."""
CHECKED_TURNS_KEPT = 10_000


class RedisLock:
    """A held session lock, kept alive by its coordinator's heartbeat until released or
    lost."""

    def __init__(
        self, coordinator: RedisCoordinator, session_id: str, token: str, work_mark: object
    ) -> None:
        self.work_mark = work_mark
        self.key = c.lock_key(session_id)
        self.session_id = session_id
        self.token = token
        self._coordinator = coordinator
        self._held = True
        self._released = False
        self._extended = time.monotonic()
        coordinator.heartbeat.keep(self)

    def held(self) -> bool:
        """False once the heartbeat found the lock gone, or could not reach Redis for a
        whole TTL (by then the lock may have expired and been taken)."""
        if time.monotonic() - self._extended > c.LOCK_TTL_MS / 1000:
            self._held = False
        return self._held

    def release(self, *, handing_over: bool = False) -> object:
        """Stop extending the lock and delete it if it is still ours; returns the work
        mark as it stands then (None once released, or if Redis cannot say).
        ``handing_over``: the kick-pending flag is raised afresh rather than lowered."""
        if self._released:
            return None
        self._released = True
        self._held = False
        self._coordinator.heartbeat.drop(self)
        session_id = self.session_id
        try:
            return self._coordinator.scripts.release(
                keys=[self.key, c.kick_pending_key(session_id), c.work_key(session_id)],
                args=[self.token, c.KICK_PENDING_SECONDS] if handing_over else [self.token],
            )
        except redis.RedisError:
            log.warning("could not release %s; it expires by itself", self.key)
            return None

    def extended(self, kept: bool, at: float) -> None:
        """The heartbeat's answer for an extension sent at ``at``."""
        if kept:
            self._extended = at
        elif not self._released:
            log.warning("lost %s", self.key)
            self._held = False
            self._coordinator.heartbeat.drop(self)


class _Heartbeat:
    """One thread per coordinator extends every lock it holds, all in one pipeline per
    beat (a drive does not pay for starting and joining a thread of its own)."""

    def __init__(self, coordinator: RedisCoordinator) -> None:
        self._coordinator = coordinator
        self._locks: set[RedisLock] = set()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def keep(self, lock: RedisLock) -> None:
        with self._guard:
            self._locks.add(lock)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="parley-heartbeat", daemon=True
                )
                self._thread.start()

    def drop(self, lock: RedisLock) -> None:
        with self._guard:
            self._locks.discard(lock)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        coordinator = self._coordinator
        while not self._stop.wait(c.HEARTBEAT_SECONDS):
            with self._guard:
                locks = list(self._locks)
            if not locks:
                continue
            sent = time.monotonic()  # the new TTL runs from no later than this

            def extend_all(pipe: Any, locks: list[RedisLock] = locks) -> None:
                for lock in locks:
                    coordinator.scripts.queue(
                        pipe, coordinator.scripts.extend, [lock.key], [lock.token, c.LOCK_TTL_MS]
                    )

            try:
                kept, _ = coordinator.pipeline(extend_all)
            except redis.RedisError:
                log.warning("heartbeat of %d lock(s) failed; retrying", len(locks))
                continue
            except Exception:  # whatever it was, the thread keeps every lock's heartbeat
                log.exception("heartbeat of %d lock(s) failed; retrying", len(locks))
                continue
            for lock, answer in zip(locks, kept, strict=True):
                lock.extended(bool(answer), sent)


class _Scripts:
    def __init__(self, client: Any) -> None:
        self.append = client.register_script(APPEND_AND_PUBLISH)
        self.adopt = client.register_script(ADOPT_TURN)
        self.extend = client.register_script(EXTEND_LOCK)
        self.release = client.register_script(RELEASE_LOCK)
        self._client = client

    @staticmethod
    def queue(pipe: Any, script: Any, keys: list[Any], args: list[Any]) -> None:
        """Queue a script call on ``pipe`` by its sha.  (Called as ``script(...,
        client=pipe)``, redis-py would ask ``SCRIPT EXISTS`` before every execute: a
        second round trip per pipeline.)"""
        pipe.evalsha(script.sha, len(keys), *keys, *args)

    def load(self) -> None:
        """Load every script into a server that lost them (a restart)."""
        for script in (self.append, self.adopt, self.extend, self.release):
            script.sha = self._client.script_load(script.script)


class RedisCoordinator(Coordinator):
    """The coordinator port on Redis."""

    def __init__(
        self,
        url: str,
        *,
        replay_seconds: int = c.ENDED_BUFFER_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        """``replay_seconds``: how long the replay buffer of a turn this process ends is
        kept after its end (a driver's setting).  ``max_connections``: how many
        connections each of its pools (commands, blocking reads) may open."""
        self.url = url
        self.replay_seconds = replay_seconds
        # Blocking pools: a thread that finds every connection in use waits for one (as
        # long as a command may take) rather than fail at once, as redis-py's default
        # pool does past its 100th ("Too many connections"), which a driver would take
        # for Redis being down.  Connections are opened as threads need them.
        # redis-py's return types depend on decode settings; results are converted here.
        self.redis: Any = redis.Redis.from_pool(
            redis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=COMMAND_SOCKET_SECONDS,
                socket_timeout=COMMAND_SOCKET_SECONDS,
                socket_connect_timeout=COMMAND_SOCKET_SECONDS,
            )
        )
        # Blocking stream reads (at most POLL seconds each) need a longer socket timeout
        # than the default, yet a finite one, so a half-open connection cannot hang them.
        self._blocking: Any = redis.Redis.from_pool(
            redis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=BLOCKING_SOCKET_SECONDS,
                socket_timeout=BLOCKING_SOCKET_SECONDS,
            )
        )
        self.scripts = _Scripts(self.redis)
        self.heartbeat = _Heartbeat(self)
        self.reachability = Reachability(
            redis_address(self.redis.connection_pool.connection_kwargs)
        )
        self._pending: list[tuple[int, Event]] = []
        self._wake = threading.Condition()
        self._sending = threading.Lock()
        self._flusher: threading.Thread | None = None
        self._closed = False
        # Per turn: the steer list's length and the steers read from it, and when; and
        # the length and time of the flusher's latest report of it.
        self._listed: dict[str, tuple[int, list[Steer], float]] = {}
        self._heard: dict[str, tuple[int, float]] = {}
        self.round_trips = 0  # pipelines sent, the events they carried, and the deltas
        self.events_sent = 0  # that joined a queued token event: for logs and benchmarks
        self.deltas_coalesced = 0
        self._tallying = threading.local()  # a driver's Tally, on the driver's thread
        self._tally_of: dict[str, Tally] = {}  # by turn: its events may go out elsewhere

    def close(self) -> None:
        """Flush what is queued and stop the flusher and the heartbeat."""
        self.heartbeat.stop()
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._flusher is not None:
            self._flusher.join(5)
        self._send_pending()
        self.redis.close()
        self._blocking.close()

    def ping(self) -> bool:
        """Whether Redis answers now."""
        try:
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

    # ------------------------------------------------------------------ locks

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
        return RedisLock(self, session_id, token, mark) if taken else None

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

    # ------------------------------------------------------------------ events

    def publish(self, events: Sequence[Event], fence: int = 0, *, now: bool = False) -> None:
        """Queue events for the flusher (returns at once), or with ``now`` send them, and
        whatever is queued before them, from the caller's thread: woken for them, the
        flusher would only make the caller's next send wait behind its own.  A driver
        passes its fence."""
        self._tally_turns(events)
        if now:
            self._send_pending([(fence, e) for e in events])
            return
        if not events:
            return
        with self._wake:
            self._pending.extend((fence, e) for e in events)
            if self._flusher is None:
                self._flusher = threading.Thread(
                    target=self._flush_loop, name="parley-deltas", daemon=True
                )
                self._flusher.start()
            self._wake.notify()

    def flush(self) -> None:
        """Send what is queued now (from the caller's thread)."""
        self._send_pending()

    @contextmanager
    def tally(self) -> Iterator[Tally]:
        """While the block runs, count what the turns this thread publishes events of
        cost in Redis, whichever thread sends those events: a driver's share of
        :attr:`round_trips`, :attr:`events_sent` and :attr:`deltas_coalesced`, which
        count the whole process's (every driver's, on a threads pool).  Flush before
        reading it."""
        tally = self._tallying.tally = Tally()
        try:
            yield tally
        finally:
            self._tallying.tally = None
            for turn_id in tally.turns:
                if self._tally_of.get(turn_id) is tally:
                    self._tally_of.pop(turn_id, None)

    def _tally_turns(self, events: Sequence[Event]) -> None:
        tally: Tally | None = getattr(self._tallying, "tally", None)
        if tally is None:
            return
        for event in events:
            if event.turn_id not in tally.turns:
                tally.turns.add(event.turn_id)
                self._tally_of[event.turn_id] = tally

    def coalesce(self, token: Event, text: str, fence: int = 0) -> Event | None:
        """Append ``text`` to ``token`` while it is the last queued event, unsent."""
        with self._wake:
            if not self._pending or self._pending[-1][1] is not token:
                return None
            if len(token.data["text"]) >= COALESCED_TEXT_LIMIT:
                return None
            # In place (this runs once per delta): an event still queued is in nobody
            # else's hands, and a send takes the queue under this lock before reading it.
            token.data["text"] += text
            self.deltas_coalesced += 1
            tally = self._tally_of.get(token.turn_id)
            if tally is not None:
                tally.coalesced += 1
            return token

    def _send_pending(self, then: Sequence[tuple[int, Event]] = ()) -> None:
        """Send what is queued, and ``then`` after it, from the caller's thread."""
        # Taking and sending under one lock keeps batches in publish order: a batch sent
        # from the caller's thread can never overtake the flusher's earlier one (the
        # stream skips a seq that arrives after a higher one).
        with self._sending:
            with self._wake:
                events, self._pending = self._pending, []
            self._flush([*events, *then])

    def _send_queued_with(
        self, then: Sequence[tuple[int, Event]], extra: Callable[[Any], object]
    ) -> tuple[list[Any], bool, float]:
        """Send what is queued, and ``then`` after it, with the commands ``extra`` puts on
        the pipeline after theirs, in one round trip from the caller's thread (under the
        send lock, as :meth:`_send_pending`).  Returns the replies to ``extra``'s
        commands, whether the pipeline ran twice, and when it was sent; raises
        ``RedisError`` (the events are then lost to the buffer, as any failed send's)."""
        with self._sending:
            with self._wake:
                queued, self._pending = self._pending, []
            batch = [*queued, *then]
            turns: list[str] = []

            def send(pipe: Any) -> None:
                turns[:] = self._queue_appends(pipe, batch)
                extra(pipe)

            at = time.monotonic()
            replies, twice = self.pipeline(send)
            self._sent(batch, turns, replies[: len(turns)], at)
            return replies[len(turns) :], twice, at

    def _flush_loop(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
            self._send_pending()

    def pipeline(self, queue: Callable[[Any], object]) -> tuple[list[Any], bool]:
        """Run the commands ``queue`` puts on a pipeline in one round trip; returns their
        replies and whether it took two.  If the server lacks the scripts they call (new,
        or restarted), load them and run the pipeline once more: every script here can
        run twice, and the caller hears that the other commands ran twice too."""
        try:
            pipe = self.redis.pipeline(transaction=False)
            queue(pipe)
            return list(pipe.execute()), False
        except redis.exceptions.NoScriptError:
            self.scripts.load()
        pipe = self.redis.pipeline(transaction=False)
        queue(pipe)
        return list(pipe.execute()), True

    def _flush(self, events: list[tuple[int, Event]]) -> None:
        if not events:
            return
        turns: list[str] = []

        def append(pipe: Any) -> None:
            turns[:] = self._queue_appends(pipe, events)

        at = time.monotonic()
        try:
            lengths, _ = self.pipeline(append)
        except redis.RedisError:
            log.warning(
                "could not publish %d event(s); readers fall back to the store", len(events)
            )
            return
        self._sent(events, turns, lengths, at)

    def _queue_appends(self, pipe: Any, events: list[tuple[int, Event]]) -> list[str]:
        """Queue on ``pipe`` one append-and-publish call per run of a turn's events with
        the same fence (one per turn, as a rule); returns the turn of each call, in order.
        A turn's calls keep its events' order: a later event sent first would make the
        stream skip an earlier one as a re-send."""
        runs: list[tuple[str, int, list[Event]]] = []
        latest: dict[str, int] = {}  # each turn's latest run
        for fence, event in events:
            at = latest.get(event.turn_id)
            if at is not None and runs[at][1] == fence:
                runs[at][2].append(event)
            else:
                latest[event.turn_id] = len(runs)
                runs.append((event.turn_id, fence, [event]))
        for turn_id, fence, batch in runs:
            ends = [e.seq for e in batch if e.kind is EventKind.END]
            args: list[Any] = [
                ends[-1] if ends else 0,
                self.replay_seconds,
                fence,
                c.IDLE_BUFFER_SECONDS,
                c.ENDS_STREAM_SECONDS,
            ]
            for event in batch:
                args += [event.seq, json.dumps(event.to_json(), separators=(",", ":"))]
            keys = [
                c.events_key(turn_id),
                c.deltas_channel(turn_id),
                c.steers_key(turn_id),
                c.owner_key(turn_id),
                c.ends_key(turn_id),
            ]
            self.scripts.queue(pipe, self.scripts.append, keys, args)
        return [turn_id for turn_id, _fence, _batch in runs]

    def _sent(
        self, events: list[tuple[int, Event]], turns: list[str], lengths: list[Any], at: float
    ) -> None:
        """Count a pipeline sent at ``at`` that carried ``events``, and note what it said
        of each turn's steer list: a reply is as good as asking, so the next
        :meth:`steers_after` within the recheck period needs no round trip unless the
        list grew."""
        self.round_trips += 1
        self.events_sent += len(events)
        if self._tally_of:
            tallies = [self._tally_of.get(event.turn_id) for _fence, event in events]
            for tally in tallies:
                if tally is not None:
                    tally.events += 1
            for tally in {id(t): t for t in tallies if t is not None}.values():
                tally.round_trips += 1
        if len(self._heard) > CHECKED_TURNS_KEPT:
            self._heard.clear()  # only a rate limit: forgetting is harmless
        for turn_id, length in zip(turns, lengths, strict=True):
            self._heard[turn_id] = (int(length), at)

    def read_events(self, turn_id: str, after: int, timeout: float) -> list[Event]:
        """Buffered events with seq > ``after``, waiting up to ``timeout`` for one."""
        entries = self._entries_after(c.events_key(turn_id), after, timeout)
        return [Event.from_json(json.loads(fields[b"e"])) for _id, fields in entries]

    def wait_end(self, turn_id: str, after: int, timeout: float) -> int:
        """The seq of the newest ``end`` past ``after`` on the turn's ends stream, waiting
        up to ``timeout`` (0 if none, or if Redis is unreachable)."""
        self.flush()  # what this process still holds counts too
        entries = self._entries_after(c.ends_key(turn_id), after, timeout)
        return _seq_of(entries[-1][0]) if entries else 0

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
        self.flush()  # what this process still holds counts too
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
        self.flush()  # what this process still holds counts too
        try:
            last = self.redis.xrevrange(c.events_key(turn_id), count=1)
        except redis.RedisError as exc:
            self.reachability.failed(exc)
            return 0
        self.reachability.answered()
        return _seq_of(last[0][0]) if last else 0

    def buffer_covers(self, turn_id: str, seq: int) -> bool:
        """The turn's stream exists and starts at or before ``seq + 1``."""
        try:
            first = self.redis.xrange(c.events_key(turn_id), count=1)
        except redis.RedisError as exc:
            self.reachability.failed(exc)
            return False
        self.reachability.answered()
        return bool(first) and _seq_of(first[0][0]) <= seq + 1

    # ------------------------------------------------------------------ steers

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
            if now - read_at < STEERS_RECHECK_SECONDS or (
                heard_length == length and now - heard_at < STEERS_RECHECK_SECONDS
            ):
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
        """Send ``events`` (and what is queued before them) now, and read the turn's
        steer list in the same round trip: what :meth:`steers_after` gives."""
        try:
            (length, entries), _twice, at = self._send_queued_with(
                [(fence, e) for e in events], lambda pipe: _queue_steer_read(pipe, turn_id)
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


def _seq_of(entry_id: bytes) -> int:
    """The seq of a replay-buffer entry (stream ids are ``<seq>-0``)."""
    return int(entry_id.split(b"-")[0])


@dataclass
class Tally:
    """What one driver's turns cost in Redis (:meth:`RedisCoordinator.tally`): the
    pipelines that carried any of their events, those events, and the deltas that joined
    one of them instead."""

    round_trips: int = 0
    events: int = 0
    coalesced: int = 0
    turns: set[str] = field(default_factory=set)
