"""Session locks in Redis: a held lock (:class:`RedisLock`) and the one heartbeat thread
per coordinator that extends every lock it holds, all in one pipeline per beat (one per
node, on a Redis Cluster)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import redis

from parley.coordination import constants as c
from parley.coordination.redis_scripts import Scripts

log = logging.getLogger("parley.redis")

Pipeline = Callable[[Callable[[Any], object]], tuple[list[Any], bool]]
"""Runs what its argument queues on a pipeline in one round trip (loading the scripts
and running it again if the server lacks them): the coordinator's ``pipeline``."""

NODE_THREADS = 8
"""How many nodes' extensions a heartbeat sends at once on a Redis Cluster."""


class RedisLock:
    """A held session lock, kept alive by its coordinator's heartbeat until released or
    lost."""

    def __init__(
        self, heartbeat: Heartbeat, session_id: str, token: str, work_mark: object
    ) -> None:
        self.work_mark = work_mark
        self.key = c.lock_key(session_id)
        self.session_id = session_id
        self.token = token
        self._heartbeat = heartbeat
        self._held = True
        self._released = False
        self._extended = time.monotonic()
        heartbeat.keep(self)

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
        self._heartbeat.drop(self)
        session_id = self.session_id
        try:
            return self._heartbeat.scripts.release(
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
            self._heartbeat.drop(self)


class Heartbeat:
    """One thread per coordinator extends every lock it holds, all in one pipeline per
    beat (a drive does not pay for starting and joining a thread of its own).

    On a Redis Cluster, one pipeline per node, each on a thread of a small pool: a node
    that stops answering (its replica not yet promoted) holds up the extension of its own
    locks only, while the client retries it, and is skipped by the beats that come
    meanwhile; the locks on the other nodes stay held, and their drivers go on.

    It is given the coordinator's parts it uses (its command client, scripts and
    pipeline runner), not the coordinator: the import goes one way."""

    def __init__(self, client: Any, scripts: Scripts, pipeline: Pipeline, *, cluster: bool) -> None:
        self.scripts = scripts
        self._client = client
        self._pipeline = pipeline
        self._cluster = cluster
        self._locks: set[RedisLock] = set()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nodes: ThreadPoolExecutor | None = None  # on a cluster: a pipeline per node
        self._in_flight: dict[str, Future[None]] = {}  # by node: its latest extension

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
        if self._nodes is not None:
            self._nodes.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.wait(c.HEARTBEAT_SECONDS):
            with self._guard:
                locks = list(self._locks)
            if not locks:
                continue
            if not self._cluster:
                self._extend(locks)
                continue
            try:
                self._beat_each_node(locks)
            except Exception:  # (the cluster's map out of reach, say): the next beat again
                log.warning("heartbeat of %d lock(s) failed; retrying", len(locks), exc_info=True)

    def _beat_each_node(self, locks: list[RedisLock]) -> None:
        """Extend the locks of each node with a pipeline of its own, on the pool; a
        node whose previous extension is still under way is left to it."""
        client = self._client
        by_node: dict[str, list[RedisLock]] = {}
        for lock in locks:
            by_node.setdefault(client.get_node_from_key(lock.key).name, []).append(lock)
        if self._nodes is None:
            self._nodes = ThreadPoolExecutor(NODE_THREADS, thread_name_prefix="parley-heartbeat")
        for node, held in by_node.items():
            running = self._in_flight.get(node)
            if running is None or running.done():
                self._in_flight[node] = self._nodes.submit(self._extend, held)

    def _extend(self, locks: list[RedisLock]) -> None:
        """Extend ``locks`` in one pipeline and tell each what Redis said."""
        scripts = self.scripts
        sent = time.monotonic()  # the new TTL runs from no later than this

        def extend_all(pipe: Any) -> None:
            for lock in locks:
                scripts.queue(pipe, scripts.extend, [lock.key], [lock.token, c.LOCK_TTL_MS])

        try:
            kept, _ = self._pipeline(extend_all)
        except redis.RedisError:
            log.warning("heartbeat of %d lock(s) failed; retrying", len(locks))
            return
        except Exception:  # whatever it was, the thread keeps every lock's heartbeat
            log.exception("heartbeat of %d lock(s) failed; retrying", len(locks))
            return
        for lock, answer in zip(locks, kept, strict=True):
            lock.extended(bool(answer), sent)
