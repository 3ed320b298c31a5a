"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from parley.coordination.local_coordinator import LocalCoordinator
from parley.coordination.redis_coordinator import RedisCoordinator
from parley.ports.backend import Coordinator
from parley.store.sql_store import SqlStore
from tests.integration.drive import migrated_store
from tests.support.fleet import REDIS_TEST_URL, flush_redis
from tests.support.redis_cluster import RedisClusterNodes, redis_cluster

COORDINATORS = ["local", "redis", "cluster"]


@pytest.fixture(scope="session")
def cluster_nodes() -> Iterator[RedisClusterNodes]:
    """A Redis Cluster for the run's tests that leave its nodes alone (emptied before
    each test)."""
    with redis_cluster() as nodes:
        yield nodes


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqlStore]:
    """A migrated store on a SQLite file of the test's own."""
    with migrated_store(f"sqlite:///{tmp_path / 'db.sqlite'}") as store:
        yield store


@pytest.fixture
def postgres_store(postgres_url: str) -> Iterator[SqlStore]:
    """A migrated store on the run's PostgreSQL database."""
    with migrated_store(postgres_url) as store:
        yield store


@pytest.fixture(params=COORDINATORS)
def coordinator(request: pytest.FixtureRequest) -> Iterator[Coordinator]:
    """Each implementation of the coordinator port in turn: the in-process one, the
    Redis one on the tests' emptied Redis database, and the Redis one on an emptied
    Redis Cluster.  Closed after the test."""
    chosen: Coordinator
    if request.param == "local":
        chosen = LocalCoordinator()
    elif request.param == "cluster":
        nodes: RedisClusterNodes = request.getfixturevalue("cluster_nodes")
        nodes.flushall()
        chosen = RedisCoordinator(nodes.url)
    else:
        flush_redis(REDIS_TEST_URL)
        chosen = RedisCoordinator(REDIS_TEST_URL)
    try:
        yield chosen
    finally:
        chosen.close()


@pytest.fixture
def peer(coordinator: Coordinator) -> Iterator[Coordinator]:
    """The coordinator as another client sees it: for Redis a second coordinator on the
    same database (another process), in process the same object (a process has one per
    database, shared by every client on it)."""
    if not isinstance(coordinator, RedisCoordinator):
        yield coordinator
        return
    other = RedisCoordinator(coordinator.url)
    try:
        yield other
    finally:
        other.close()
