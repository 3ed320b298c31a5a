"""The acceptance suite runs every test body on each deployment: embedded on SQLite,
embedded on PostgreSQL, and the fleet (real worker and sweeper processes) on PostgreSQL
and Redis.  Tests of in-process hooks carry ``@pytest.mark.embedded_only``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import parley
from tests.conftest import fresh_postgres_database
from tests.fleet import Fleet, flush_redis
from tests.helpers import Control
from tests.hosts import workspace_host

ALL = ["embedded-sqlite", "embedded-postgres", "fleet-postgres"]
EMBEDDED = ALL[:2]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        embedded_only = metafunc.definition.get_closest_marker("embedded_only") is not None
        params = EMBEDDED if embedded_only else ALL
        metafunc.parametrize(
            "backend",
            [
                pytest.param(p, marks=[pytest.mark.postgres] if "postgres" in p else [])
                for p in params
            ],
        )


@pytest.fixture(scope="session")
def fleet(fleet_postgres_url: str) -> Iterator[Fleet]:
    """One worker (two processes) and a sweeper for the whole acceptance run."""
    pool = Fleet(database_url=fleet_postgres_url)
    flush_redis(pool.redis_url)
    pool.start_worker()
    pool.start_beat()
    try:
        pool.wait_ready()
        yield pool
    finally:
        pool.stop()


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "embedded-sqlite":
        return f"sqlite:///{tmp_path / 'parley.db'}"
    name = "fleet_postgres_url" if backend.startswith("fleet") else "postgres_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def control(workspace: Path) -> Control:
    """The test's handle on what ``workspace_host`` does."""
    return Control(workspace)


@pytest.fixture
def subprocess_env(backend: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """What a second process needs to reach the same deployment."""
    if backend.startswith("fleet"):
        pool: Fleet = request.getfixturevalue("fleet")
        env = pool.env()
        env.pop("PARLEY_HOST")
        return env
    return {
        "PARLEY_HOST": "tests.hosts:workspace_host",
        "PYTHONPATH": str(Path(__file__).parents[2]),
    }


ClientFactory = Callable[..., parley.Client]


@pytest.fixture
def make_client(
    backend: str, db_url: str, control: Control, request: pytest.FixtureRequest
) -> Iterator[ClientFactory]:
    """``make_client(rules, policy={...})`` sets this test's script and policy and returns
    a client of the deployment under test; ``make_client(host=...)`` (embedded only) runs
    an in-process host instead."""
    clients: list[parley.Client] = []
    pool: Fleet | None = None
    if backend.startswith("fleet"):
        pool = request.getfixturevalue("fleet")
        flush_redis(pool.redis_url)

    def factory(
        rules: list[dict[str, Any]] | None = None,
        *,
        policy: dict[str, Any] | None = None,
        host: parley.Host | None = None,
    ) -> parley.Client:
        if rules is not None:
            control.script(rules)
        if policy is not None:
            control.policy(**policy)
        if pool is not None:
            assert host is None, (
                "an in-process host cannot reach the fleet: mark the test embedded_only"
            )
            client = parley.connect(db_url, redis_url=pool.redis_url, queue=pool.queue)
        else:
            client = parley.connect(db_url, host=host or workspace_host(), migrate_schema=True)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.close(timeout=10)


def host_fleet(host: str) -> Any:
    """A module-scoped fixture: a fleet (a threads-pool worker and a sweeper) whose
    workers load ``host``, on a database of its own (a sweeper adopts every turn of its
    database, so two fleets with different hosts must never share one)."""

    @pytest.fixture(scope="module")
    def fixture() -> Iterator[Fleet]:
        with fresh_postgres_database("host") as url:
            pool = Fleet(database_url=url, host=host)
            pool.start_worker(concurrency=2, pool="threads")
            pool.start_beat()
            try:
                pool.wait_ready()
                yield pool
            finally:
                pool.stop()

    return fixture


@contextmanager
def deployed_client(
    deployment: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    *,
    fleet: str,
    host: Callable[[], parley.Host],
) -> Iterator[parley.Client]:
    """A client of ``deployment`` whose turns run on ``host``: in this process, or on the
    fleet the fixture named ``fleet`` (a :func:`host_fleet`) started with it."""
    if deployment.startswith("fleet"):
        pool: Fleet = request.getfixturevalue(fleet)
        flush_redis(pool.redis_url)
        with parley.connect(pool.database_url, redis_url=pool.redis_url, queue=pool.queue) as c:
            yield c
        return
    if deployment == "embedded-sqlite":
        url = f"sqlite:///{tmp_path / 'runs.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    with parley.connect(url, host=host(), migrate_schema=True) as embedded:
        yield embedded
