"""A fleet process's connection pools, sized for the turns it drives at once: a thread
that finds every Redis connection of a pool in use waits for one instead of failing
(redis-py's own pool raises "Too many connections" past its size, which a driver takes
for Redis being down), a runtime's pools have the sizes its budget says, and a
PostgreSQL connection the server drops never makes the process hold more than its pool's
size: its connections name the process, so that can be counted."""

from __future__ import annotations

import os
import threading
import time
import uuid

import psycopg
import pytest
import redis
from sqlalchemy import text

from parley.coordination.redis_coordinator import RedisCoordinator
from parley.engine.emitter import Emitter
from parley.runtime.concurrency import ConnectionBudget
from parley.runtime.fleet import FleetRuntime
from parley.schemas.errors import StoreError
from parley.store import statements as q
from parley.store.sql_store import SqlStore
from tests.support.databases import PG_ADMIN_URL
from tests.support.fleet import REDIS_TEST_URL, flush_redis
from tests.support.waiting import wait_until


def blocked_reads(admin: redis.Redis, db: int) -> int:
    """How many clients of database ``db`` are blocked in an XREAD now."""
    return sum(1 for c in admin.client_list() if c.get("db") == str(db) and c.get("cmd") == "xread")


def test_readers_past_the_pools_size_wait_for_a_connection_instead_of_failing() -> None:
    flush_redis(REDIS_TEST_URL)
    small = RedisCoordinator(REDIS_TEST_URL, max_connections=2)
    writer = RedisCoordinator(REDIS_TEST_URL)
    admin = redis.Redis.from_url(REDIS_TEST_URL)
    db = int(admin.connection_pool.connection_kwargs.get("db", 0))
    turn_id = str(uuid.uuid4())
    readers = 6
    entered = threading.Semaphore(0)
    got: list[list[str]] = []

    def read() -> None:
        entered.release()
        events = small.read_events(turn_id, 0, timeout=5)
        got.append([e.data["text"] for e in events])

    threads = [threading.Thread(target=read) for _ in range(readers)]
    try:
        for thread in threads:
            thread.start()
        for _ in range(readers):
            assert entered.acquire(timeout=10)
        # Two readers hold the pool's two connections, blocked on the empty stream; the
        # other four have asked the pool for one by now (a failing pool has failed them).
        wait_until(lambda: blocked_reads(admin, db) == 2, what="two blocked reads")
        time.sleep(0.2)
        assert blocked_reads(admin, db) == 2  # never more than the pool's size
        Emitter(turn_id, 1, writer, fence=1).emit_delta(0, "hello")
        writer.flush()
        for thread in threads:
            thread.join(30)
        assert got == [["hello"]] * readers
    finally:
        small.close()
        writer.close()
        admin.close()


@pytest.mark.postgres
def test_a_runtime_sizes_its_pools_for_the_turns_it_drives(postgres_url: str) -> None:
    budget = ConnectionBudget.for_drivers(300, database_pool_size=7)
    runtime = FleetRuntime.build(
        database_url=postgres_url, redis_url=REDIS_TEST_URL, host=None, budget=budget
    )
    try:
        assert runtime.coordinator.redis.connection_pool.max_connections == budget.redis
        assert budget.redis > 300
        pool = runtime.store.engine.pool
        assert (pool.size(), pool._max_overflow) == (7, 7)  # type: ignore[attr-defined]
    finally:
        runtime.close()


def held_by(application_name: str) -> int:
    """How many connections the server holds for clients named ``application_name``."""
    with psycopg.connect(PG_ADMIN_URL.replace("+psycopg", ""), autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def terminate(backend: int) -> None:
    """Terminate, on the server, the connection whose server process is ``backend``."""
    with psycopg.connect(PG_ADMIN_URL.replace("+psycopg", ""), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (backend,))


@pytest.mark.postgres
def test_a_runtimes_connections_name_its_role_and_its_pid(postgres_url: str) -> None:
    runtime = FleetRuntime.build(
        database_url=postgres_url, redis_url=REDIS_TEST_URL, host=None, role="parley-beat"
    )
    try:
        assert runtime.store.ping()
        assert held_by(f"parley-beat:{os.getpid()}") == 1
    finally:
        runtime.close()


@pytest.mark.postgres
def test_a_dropped_connection_leaves_the_pool_no_larger_than_its_size(postgres_url: str) -> None:
    # Two connections at most, both in use: one thread holds its transaction open while
    # the server drops the other's, whose next statement finds it broken.  Discarding
    # the whole pool then (engine.dispose()) left the held one open, in the old pool it
    # went back to, while the new pool opened two more.
    role = f"parley-test-{uuid.uuid4().hex[:8]}"
    name = f"{role}:{os.getpid()}"
    store = SqlStore.from_url(postgres_url, pool_size=2, max_overflow=0, role=role)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.db.tx() as db:
            db.execute(q.PING)
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    seen: list[int] = []
    try:
        holder.start()
        assert holding.wait(10)
        with pytest.raises(StoreError), store.db.tx() as db:
            terminate(db.execute(text("SELECT pg_backend_pid()")).scalar_one())
            wait_until(lambda: held_by(name) == 1, what="the connection dropped")
            db.execute(q.PING)  # the direct path, on a broken connection
        release.set()
        holder.join(10)
        # The next transactions, two at once, as busy threads run them: the pool opens
        # a fresh connection in place of the broken one, never beside the others.
        both = threading.Barrier(2)

        def busy() -> None:
            with store.db.tx() as db:
                db.execute(q.PING)
                both.wait(10)
                seen.append(held_by(name))

        pair = [threading.Thread(target=busy) for _ in range(2)]
        for thread in pair:
            thread.start()
        for thread in pair:
            thread.join(10)
        assert len(seen) == 2
        assert max(seen) <= 2, seen
        assert store.ping()
    finally:
        release.set()
        holder.join(10)
        store.close()
